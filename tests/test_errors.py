"""One line and a documented exit code per expected failure, as a user sees them (subprocesses of
`python -m summrl.train`), and the classification behind them on the libraries' real exceptions."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from summrl.errors import KINDS, ConfigError, classify
from summrl.storage import COMPLETE
from tests.conftest import ROOT, keys, run_cli

NOISE = ("Traceback", "<sky-payload>", "urllib3", "Failed to fetch", "During handling")


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("summrl:") and " error: " in line]


def offline_env(tmp_path, **extra) -> dict:
    """No network whatever the machine has: every HTTP(S) request goes to a closed port, and SkyPilot has
    no catalog cached (its runtime dir is empty), so it must fetch one."""
    dead = "http://127.0.0.1:9"
    return {"HOME": str(tmp_path / "home"), "SKY_RUNTIME_DIR": str(tmp_path / "sky"), "NO_PROXY": "", "no_proxy": "",
            **{k: dead for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")}, **extra}


def runpod_home(tmp_path) -> None:
    (tmp_path / "home" / ".runpod").mkdir(parents=True)
    (tmp_path / "home" / ".runpod" / "config.toml").write_text('[default]\napi_key = "planted-runpod"\n')


def test_no_network_the_default_launch_still_lists_everything_missing(tmp_path):
    run_dir = tmp_path / "run"
    keys = {k: "" for k in ("GEMINI_API_KEY", "BACKUP_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    result = run_cli([f"hydra.run.dir={run_dir}"], cwd=ROOT, timeout=120, env=offline_env(tmp_path, **keys))
    output = result.stdout + result.stderr
    assert result.returncode == KINDS["preflight"][0] == 3, output[-3000:]
    assert result.stderr.startswith("summrl: preflight error: can't launch on runpod yet:\n")
    for item in (".runpod/config.toml does not exist", "GEMINI_API_KEY", "BACKUP_BUCKET", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "SkyPilot's catalog could not be reached"):
        assert item in result.stderr
    assert not any(noise in output for noise in NOISE), output[-3000:]
    # the run folder says why it never started
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["error_kind"] == "preflight" and record["exit_code"] == 3
    assert "GEMINI_API_KEY" in record["error"]


def test_no_network_a_dry_run_prints_the_task_and_one_line_about_the_catalog(tmp_path):
    runpod_home(tmp_path)
    result = run_cli(["backend.dry_run=true", "judge=lexical", "storage.enabled=false", f"hydra.run.dir={tmp_path}/run"],
                     cwd=ROOT, timeout=120, env=offline_env(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "backend=local_gpu" in result.stdout and "accelerators:\n    H100: 1" in result.stdout  # the task
    notes = [line for line in result.stdout.splitlines() if "catalog could not be reached" in line]
    assert len(notes) == 1 and notes[0].startswith("summrl: dry run: SkyPilot's catalog could not be reached")
    assert notes[0].endswith("nothing was launched")
    assert not any(noise in output for noise in NOISE), output[-3000:]


def test_no_network_a_launch_is_one_network_error_line(tmp_path):
    runpod_home(tmp_path)
    result = run_cli(["judge=lexical", "storage.enabled=false", f"hydra.run.dir={tmp_path}/run"],
                     cwd=ROOT, timeout=120, env=offline_env(tmp_path))
    assert result.returncode == KINDS["network"][0] == 5, result.stderr[-3000:]
    assert result.stderr.splitlines() == error_lines(result.stderr)  # nothing but the line
    (line,) = error_lines(result.stderr)
    assert line.startswith("summrl: network error: SkyPilot's catalog could not be reached")
    assert line.count("check the network connection") == 1
    assert not any(noise in result.stdout + result.stderr for noise in NOISE)


def test_a_config_error_is_one_line_and_a_traceback_only_with_hydra_full_error(tmp_path):
    args = ["experiment=local", "trainer.max_steps=-1"]
    plain = run_cli([*args, f"hydra.run.dir={tmp_path}/plain"], cwd=ROOT, timeout=60, env={"HYDRA_FULL_ERROR": ""})
    assert plain.returncode == 2
    assert error_lines(plain.stderr) == plain.stderr.splitlines()
    assert plain.stderr.startswith("summrl: config error: trainer.max_steps")
    record = json.loads((tmp_path / "plain" / "result.json").read_text())
    assert record["error_kind"] == "config" and "trainer.max_steps" in record["error"]
    assert not (tmp_path / "plain" / "art").exists()

    full = run_cli([*args, f"hydra.run.dir={tmp_path}/full"], cwd=ROOT, timeout=60, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and "trainer.max_steps" in full.stderr


def test_a_key_hydra_refuses_while_composing_is_a_config_error_too(tmp_path):
    """Hydra's own composition error (summrl.cli): the same one line and exit 2; its traceback with
    HYDRA_FULL_ERROR=1 only."""
    args = ["experiment=local", "trainer.max_stepz=3", f"hydra.run.dir={tmp_path}/run"]
    plain = run_cli(args, cwd=ROOT, timeout=60, env={"HYDRA_FULL_ERROR": ""})
    assert plain.returncode == 2 and plain.stderr.splitlines() == error_lines(plain.stderr)
    assert plain.stderr.startswith("summrl: config error: trainer.max_stepz is not a setting of TrainerConfig. "
                                   "Did you mean trainer.max_steps?")
    full = run_cli(args, cwd=ROOT, timeout=60, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and "max_stepz" in full.stderr


def test_a_sweep_records_each_failed_job_goes_on_and_ends_without_a_traceback(tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(["-m", "experiment=local", "trainer.max_steps=-1,-2", f"hydra.sweep.dir={sweep}"], cwd=ROOT,
                     timeout=60, env={"HYDRA_FULL_ERROR": ""})
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    for job, steps in (("0", -1), ("1", -2)):  # the second job ran after the first failed
        record = json.loads((sweep / job / "result.json").read_text())
        assert record["error_kind"] == "config" and f"got {steps}" in record["error"] and record["job_num"] == int(job)
        assert f"summrl: config error: trainer.max_steps: must be > 0, got {steps}" in result.stderr


def test_a_failed_config_does_not_overwrite_an_earlier_record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"status": "completed", "steps": 3}))
    result = run_cli(["experiment=local", "model.lr=-1", f"hydra.run.dir={run_dir}"], cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert json.loads((run_dir / "result.json").read_text()) == {"status": "completed", "steps": 3}


@pytest.mark.slow
def test_a_judge_that_refuses_the_key_ends_the_run_with_one_judge_line(tmp_path, tiny_weights):
    from summrl.testing import FakeLLM, Reply

    run_dir = tmp_path / "run"
    with FakeLLM() as fake:
        fake.script = [Reply(status=401)] * 200
        result = run_cli(["experiment=local", tiny_weights, "judge=openai_compatible", "judge.model=openai/fake-judge",
                          f"judge.api_base={fake.base_url}", "judge.api_key_env=FAKE_JUDGE_KEY", "judge.cache_dir=null",
                          "trainer.max_steps=1", "trainer.max_summary_tokens=8", "dataset.val_size=1",
                          f"hydra.run.dir={run_dir}"],
                         cwd=ROOT, timeout=600, env={"FAKE_JUDGE_KEY": "sk-planted-judge-41"})
        refused = len(fake.requests)
    assert result.returncode == KINDS["judge"][0] == 4, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert "AuthenticationError x16" in line
    assert line.startswith("summrl: judge error: ") and "have no reward" in line
    assert line.count("fake-judge") == 1  # named once
    assert "failed after 1 attempt(s)" in line  # a refused key is not retried
    assert "To fix: check the key in FAKE_JUDGE_KEY" in line and "max_retries" not in line  # advice that fits
    assert "Traceback" not in result.stderr and "sk-planted-judge-41" not in result.stdout + result.stderr
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["error_kind"] == "judge" and record["exit_code"] == 4
    assert "MissingRewardsError" in record["error"]
    assert refused >= 16 and record["judge_retries"] == 0  # the server refused each call once, and none was retried


@pytest.mark.slow
def test_an_unusable_s3_bucket_is_one_s3_line(tmp_path, s3_endpoint):
    from tests.conftest import CREDENTIALS

    result = run_cli(["experiment=local", "storage.enabled=true", "storage.bucket=no-such-bucket",
                      "storage.create_bucket=false", f"storage.endpoint_url={s3_endpoint}", f"hydra.run.dir={tmp_path}/run"],
                     cwd=ROOT, timeout=300, env=CREDENTIALS)
    assert result.returncode == KINDS["s3"][0] == 6, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith("summrl: S3 error: ") and "no-such-bucket" in line
    assert "Traceback" not in result.stderr
    assert json.loads((tmp_path / "run" / "result.json").read_text())["error_kind"] == "s3"


def test_library_exceptions_map_to_their_kind():
    import botocore.exceptions
    import requests
    import wandb.errors

    def chained(outer: Exception, cause: Exception) -> Exception:
        try:
            try:
                raise cause
            except Exception as e:
                raise outer from e
        except Exception as e:
            return e

    def kind(e):
        failure = classify(e)
        return failure and failure.kind

    assert kind(wandb.errors.AuthenticationError("API key must be 40 characters long, yours was 7")) == "wandb"
    assert kind(botocore.exceptions.NoCredentialsError()) == "s3"
    import sky.exceptions

    assert kind(sky.exceptions.ResourcesUnavailableError("no H100 left in any region")) == "skypilot"
    offline = chained(requests.exceptions.ConnectionError("HTTPSConnectionPool(host='api.wandb.ai', port=443)"),
                      OSError("[Errno -2] Name or service not known"))
    failure = classify(offline)
    assert failure.kind == "network" and "can't reach api.wandb.ai" in failure.message
    assert kind(chained(RuntimeError("while loading"), offline)) == "network"
    assert kind(ValueError("a bug")) is None and kind(KeyboardInterrupt()) is None
    # one exit code per kind, but for the two that share one on purpose (README: "When a run fails")
    shared = {"sft": "config", "not_confirmed": "preflight"}
    assert len({code for k, (code, _) in KINDS.items() if k not in shared}) == len(KINDS) - len(shared)
    assert all(KINDS[k][0] == KINDS[v][0] for k, v in shared.items())


def test_our_own_exceptions_map_to_their_kind_by_class():
    """By class, not by where a class lives: a judge that fails ends as a judge error wherever the error moves."""
    from summrl.errors import ConfigError
    from summrl.judges.client import JudgeError
    from summrl.missing_rewards import MissingRewardsError
    from summrl.preflight import PreflightError
    from summrl.sft import CostNotConfirmed, SFTError
    from summrl.storage import StorageError

    failure = classify(MissingRewardsError("20 of the last 64 rollouts have no reward"))
    assert (failure.kind, failure.exit_code) == ("judge", 4)
    assert failure.line == "summrl: judge error: 20 of the last 64 rollouts have no reward"
    assert classify(JudgeError("judge x failed after 6 attempt(s)")).kind == "judge"
    assert classify(PreflightError("can't start:\n  - A\n  - B")).message == "can't start:\n  - A\n  - B"
    assert classify(ConfigError("model.lr: bad")).exit_code == 2
    assert classify(StorageError("storage: bucket b does not exist")).exit_code == 6
    sft = classify(SFTError("sft: no summary reached sft.min_reward=0.9: lower it or use sft.top_k"))
    assert (sft.exit_code, sft.line) == (2, "summrl: SFT error: sft: no summary reached sft.min_reward=0.9: "
                                            "lower it or use sft.top_k")
    refused = classify(CostNotConfirmed("sft: the teacher's cost was not confirmed; nothing was called"))
    assert refused.exit_code == 3 == KINDS["preflight"][0]  # the benchmark's cost guard exits 3 too
    assert refused.line == "summrl: not confirmed: sft: the teacher's cost was not confirmed; nothing was called"
    # a bug raised while handling an expected failure is still a bug; one raised from it says what failed
    try:
        try:
            raise MissingRewardsError("judge down")
        except MissingRewardsError:
            {}["a bug"]
    except KeyError as e:
        assert classify(e) is None
    try:
        try:
            raise MissingRewardsError("judge down")
        except MissingRewardsError as e:
            raise RuntimeError("while stopping") from e
    except RuntimeError as e:
        assert classify(e).kind == "judge"


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_loopback_refusal_or_a_bug_while_handling_a_connection_error_is_not_a_network_error():
    import requests

    from summrl.errors import is_network

    port = closed_port()
    session = requests.Session()
    session.trust_env = False  # no proxy from this machine's environment
    with pytest.raises(requests.exceptions.ConnectionError) as refused:
        session.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    assert not is_network(refused.value) and classify(refused.value) is None  # a local server is down: a bug
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as embedded:
        client.models.list()
    assert not is_network(embedded.value) and classify(embedded.value) is None
    # a proxy that can't be reached is the network's business, loopback or not
    session.proxies = {"https": f"http://127.0.0.1:{port}"}
    with pytest.raises(requests.exceptions.ProxyError) as proxy:
        session.get("https://api.wandb.ai/graphql", timeout=5)
    failure = classify(proxy.value)
    assert failure.kind == "network" and "can't reach api.wandb.ai" in failure.message
    assert "HTTPS_PROXY" in failure.message
    # a bug in an except block that handles a connection error is a bug, not an outage
    try:
        try:
            raise proxy.value
        except requests.exceptions.ConnectionError:
            [][1]
    except IndexError as e:
        assert not is_network(e) and classify(e) is None


def test_the_readme_documents_every_exit_code():
    readme = (ROOT / "README.md").read_text()
    for kind, (code, label) in KINDS.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| {code} | {label} |")), None)
        assert row is not None, kind
        assert f"`summrl: {label}: " in row, kind  # with an example of its line


def test_wandb_mode_from_the_environment_unless_logger_mode_says(monkeypatch, tmp_path):
    from summrl.tracking import open_tracker
    from tests.conftest import compose_config, wandb_records

    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)  # would go online under logger.mode=auto, without WANDB_MODE
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = compose_config(["experiment=local", "logger=wandb", f"run.dir={tmp_path}", "run.name=modes"])
    tracker = open_tracker(config, None, tmp_path / "history.jsonl")
    try:
        assert tracker.run.settings.mode == "offline" and tracker.run.offline
    finally:
        tracker.finish("completed")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = compose_config(["experiment=local", "logger=wandb", "logger.mode=offline", f"run.dir={tmp_path}",
                             "run.name=modes2"])
    tracker = open_tracker(config, None, tmp_path / "history.jsonl")  # the explicit mode wins over the environment
    try:
        assert tracker.run.offline and not tracker.run.disabled
    finally:
        tracker.finish("completed")
    # a stopped run (to be resumed) is marked preempting, with Ctrl-C's exit code: it was finished as failed (1)
    stopped = tmp_path / "stopped"
    config = compose_config(["experiment=local", "logger=wandb", "logger.mode=offline", f"run.dir={stopped}",
                             "run.name=stopped"])
    open_tracker(config, None, stopped / "history.jsonl").finish("interrupted")
    deadline = time.monotonic() + 30
    while (record := wandb_records(stopped))["exit_code"] is None and time.monotonic() < deadline:
        time.sleep(0.2)  # W&B's service writes the run's file after finish() returns (a loaded machine: seconds later)
    assert (record["exit_code"], record.get("preempting")) == (130, True)


def test_a_resumed_wandb_run_gets_this_invocations_config_only_once_it_trains(tmp_path):
    """A resume refused before it trained (another reward, a declined cost estimate) sent its config when W&B opened,
    so the W&B run it left as it was showed the refused settings. A folder holding a run now sends it only once past
    every check (``trains``); a new run sends it at once, so even a failure at the start is filed under its settings."""
    from summrl.tracking import open_tracker
    from tests.conftest import compose_config, wandb_records

    def opened(name: str, holds_a_run: bool):
        run_dir = tmp_path / name
        run_dir.mkdir()
        if holds_a_run:
            (run_dir / "history.jsonl").write_text(json.dumps({"training_step": 0, "val/reward": 0.25}) + "\n")
        config = compose_config(["experiment=local", "logger=wandb", "logger.mode=offline", f"run.dir={run_dir}",
                                 f"run.name={name}", "trainer.max_steps=7"])
        return run_dir, open_tracker(config, None, run_dir / "history.jsonl")

    refused_dir, refused = opened("refused", holds_a_run=True)
    refused.finish("failed", 2)
    trained_dir, trained = opened("trained", holds_a_run=True)
    trained.trains()
    trained.finish("completed")
    new_dir, new = opened("new", holds_a_run=False)
    new.finish("failed", 2)
    records = {}
    for run_dir in (refused_dir, trained_dir, new_dir):
        deadline = time.monotonic() + 30
        while (record := wandb_records(run_dir))["exit_code"] is None and time.monotonic() < deadline:
            time.sleep(0.2)  # W&B's service writes the run's file after finish() returns
        records[run_dir] = record
    assert not [k for k in records[refused_dir]["config"] if not k.startswith("_")]  # W&B's own "_wandb" only
    assert records[refused_dir]["exit_code"] == 2
    assert records[trained_dir]["config"]["trainer.max_steps"] == 7
    assert records[new_dir]["config"]["trainer.max_steps"] == 7


def test_a_resume_keeps_its_wandb_runs_name_and_a_folders_first_wandb_run_gets_its_own(tmp_path, monkeypatch):
    """W&B renames a run resumed with a name: a resume with a raised trainer.max_steps renamed the W&B run after that
    override (W&B itself can't be reached here, and offline it never resumes: its init is recorded, as a W&B run)."""
    import types

    import wandb

    from summrl.job import JobInfo
    from summrl.tracking import open_tracker
    from tests.conftest import compose_config

    def opened(resumed: bool, holds_a_run: bool):
        run_dir = tmp_path / f"{resumed}-{holds_a_run}"
        run_dir.mkdir()
        if holds_a_run:
            (run_dir / "history.jsonl").write_text(json.dumps({"training_step": 0, "val/reward": 0.25}) + "\n")
        inits = []

        def init(**kwargs):
            inits.append(kwargs)
            return types.SimpleNamespace(name=kwargs["name"] or "the-runs-own-name", resumed=resumed, summary={},
                                         define_metric=lambda *a, **k: None)

        monkeypatch.setattr(wandb, "init", init)
        config = compose_config(["experiment=local", "logger=wandb", f"run.dir={run_dir}", "run.name=r"])
        tracker = open_tracker(config, JobInfo(overrides=["trainer.max_steps=9"]), run_dir / "history.jsonl")
        return inits[0]["name"], tracker.run.name

    assert opened(resumed=True, holds_a_run=True) == (None, "the-runs-own-name")
    assert opened(resumed=False, holds_a_run=True) == (None, "trainer.max_steps=9")  # logger=wandb from now on
    assert opened(resumed=False, holds_a_run=False) == (None, "trainer.max_steps=9")
    # a fresh machine: the folder is empty as the tracker opens (S3 restores its history after), and W&B resumes
    assert opened(resumed=True, holds_a_run=False) == (None, "the-runs-own-name")


@pytest.mark.slow
def test_a_wandb_key_refused_at_the_start_records_a_complete_failed_run_keeping_the_earlier_one(tmp_path, monkeypatch):
    """W&B refuses the key before the loop has recorded anything (the tracker opens first): one W&B line, exit 7,
    and a complete failed record that keeps what the run's earlier invocation recorded."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    history = [{"step": 0, "val_reward": 0.25, "val_qa_accuracy": 0.25, "per_doc": {}},
               {"step": 2, "val_reward": 0.3, "val_qa_accuracy": 0.3, "per_doc": {}}]
    earlier = {"status": "completed", "run_name": "wb", "steps": 2, "val_history": history, "wall_s": 61.5,
               "final_val_score": 0.3}
    (run_dir / "result.json").write_text(json.dumps(earlier))
    result = run_cli(["experiment=local", "logger=wandb", "logger.mode=online", "trainer.max_steps=4", "run.name=wb",
                      f"hydra.run.dir={run_dir}"], cwd=ROOT, timeout=300,
                     env={"WANDB_API_KEY": "planted-bad-wandb-key", "HOME": str(tmp_path / "home"),
                          "HYDRA_FULL_ERROR": ""})
    assert result.returncode == KINDS["wandb"][0] == 7, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert result.stderr.strip().splitlines()[-1] == line and line.startswith("summrl: W&B authentication error: ")
    assert "Traceback" not in result.stderr
    assert "planted-bad-wandb-key" not in result.stdout + result.stderr
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["error"] == line.removeprefix("summrl: ")
    assert (record["error_kind"], record["exit_code"]) == ("wandb", 7)
    assert record["val_history"] == history and record["wall_s"] == 61.5 and record["run_name"] == "wb"
    assert "trainer.max_steps=4" in record["overrides"]  # this invocation's
    assert "planted-bad-wandb-key" not in (run_dir / "result.json").read_text()


@pytest.mark.slow
def test_the_benchmark_ends_like_training_with_one_line_and_its_exit_code(tmp_path, monkeypatch):
    """python -m summrl.benchmark: W&B refuses the key when the finished benchmark is logged. The rows are on disk;
    the run ends with the one W&B line and its exit code, not a traceback."""
    from summrl.testing import FakeLLM

    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "out"
    with FakeLLM() as fake:
        model = "{model: openai/fake-frontier, api_base: '" + fake.base_url + "'}"
        result = run_cli_module("summrl.benchmark", [
            "experiment=local", "judge=lexical", "dataset.val_size=1", "benchmark.rollouts_per_doc=1",
            "trainer.max_summary_tokens=16", f"benchmark.models=[{model}]", "benchmark.confirm=false", "logger=wandb",
            "logger.mode=online", f"hydra.run.dir={out}"],
            env={"WANDB_API_KEY": "planted-bad-wandb-key", "HOME": str(tmp_path / "home"), "HYDRA_FULL_ERROR": ""})
    assert result.returncode == KINDS["wandb"][0], result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("summrl: W&B authentication error: ")
    assert len(error_lines(result.stderr)) == 1 and "Traceback" not in result.stderr
    assert (out / "rows.csv").is_file()  # scored before it was published: nothing paid for is lost


def run_cli_module(module: str, args: list[str], env: dict, timeout: float = 300):
    import subprocess

    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


# An entry point's main under summrl.cli.run: a non-daemon thread still writing, a thread pool, an atexit handler,
# a buffered print, then the exit the argument asks for.
ENDING = """
import atexit, concurrent.futures, sys, threading, time
from pathlib import Path
from summrl import cli

folder, code = Path(sys.argv[1]), sys.argv[2]

def main():
    def late():
        time.sleep(0.5)
        (folder / "thread").write_text("joined")
    threading.Thread(target=late).start()
    concurrent.futures.ThreadPoolExecutor(1).submit(lambda: None).result()  # an idle worker, as asyncio leaves
    atexit.register(lambda: (folder / "atexit").write_text("ran"))
    print("the last line", end="")
    if code != "none":
        sys.exit(int(code) if code.isdigit() else code)

cli.run(main)
"""


@pytest.mark.parametrize("code, status", [("none", 0), ("0", 0), ("2", 2), ("a message", 1)])
def test_an_entry_point_ends_as_python_would_joining_threads_and_running_atexit(tmp_path, code, status):
    """cli.run ends the process without the interpreter's module teardown (2 s after ART is loaded); what Python's own
    exit does for a user still happens: threads joined, atexit handlers run, output flushed, the exit status kept."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", ENDING, str(tmp_path), code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == status, result.stderr[-2000:]
    assert result.stdout == "the last line"
    assert (tmp_path / "thread").read_text() == "joined" and (tmp_path / "atexit").read_text() == "ran"
    assert result.stderr == ("a message\n" if code == "a message" else "")


STOPPING = """
import signal, sys, threading, time
from summrl import cli

def joined():  # joined as the process ends: says so once the exit has begun, then waits for the test's signals
    while signal.getsignal(signal.SIGINT) is not cli._already_stopping:
        time.sleep(0.01)
    print("joining", flush=True)
    sys.stdin.read()  # until the test closes it

def main():
    threading.Thread(target=joined).start()
    sys.exit(130)

cli.run(main)
"""


def test_signals_while_the_process_ends_are_said_once_and_change_nothing():
    """An impatient second Ctrl-C (or a SIGTERM) while an interrupted run joined its threads raised KeyboardInterrupt
    there: about 90 lines of tracebacks, then 'terminate called without an active exception' and an abort (-6) where
    result.json said 130; serve exited 1 where the README says 0."""
    import signal
    import subprocess

    process = subprocess.Popen([sys.executable, "-c", STOPPING], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "joining\n"  # in the join (a fixed 0.3 s raced a loaded machine)
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        process.send_signal(stop)
        time.sleep(0.1)
    out, err = process.communicate(timeout=30)  # (closes stdin: the thread ends)
    assert process.returncode == 130, err[-2000:]
    assert err == "summrl: already stopping: closing threads and files (kill -9 ends it now, unsaved)\n"


def tiny_training(entry: list[str], tiny_weights: str, run_dir: Path, name: str, max_steps: int, *extra: str,
                  background: bool = False):
    """``python <entry> experiment=local`` on the tiny weights at the smallest scale, its output line-buffered for a
    test to send a signal at the line it waits for. ``background``: started with Ctrl-C ignored, as a script's
    ``cmd &`` starts it."""
    import signal
    import subprocess

    return subprocess.Popen(
        [sys.executable, *entry, "experiment=local", tiny_weights, f"trainer.max_steps={max_steps}",
         "trainer.max_summary_tokens=8", "trainer.groups_per_step=1", "trainer.rollouts_per_group=2",
         "trainer.val_rollouts_per_doc=1", "dataset.val_size=1", f"run.name={name}", f"hydra.run.dir={run_dir}", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None)


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_training_with_one_line_and_the_checkpoints_kept(tmp_path, tiny_weights, stop,
                                                                                  s3_endpoint, aws_env):
    """SIGINT (Ctrl-C), or SIGTERM (`kill`, a scheduler, a cancelled job), during `python -m summrl.train`: one line
    naming the signal, the last step and how to resume, no traceback, exit code 128 + the signal as a shell reports
    it, result.json status interrupted; the checkpoints written are there to resume from, and the last one is backed
    up whatever storage.backup_every says (it was not: a fresh machine resumed from an older step)."""
    import re
    import signal

    run_dir = tmp_path / "run"
    bucket = f"stopped-{stop.lower()}"  # the S3 server is the session's: its own bucket, or it resumes the other's
    process = tiny_training(["-m", "summrl.train"], tiny_weights, run_dir, "interrupted", 50, "storage.enabled=true",
                            f"storage.bucket={bucket}", f"storage.endpoint_url={s3_endpoint}", "storage.backup_every=50")
    for line in process.stdout:
        if line.startswith("summrl: step 1 | train"):
            process.send_signal(getattr(signal, stop))
            break
    out, err = process.communicate(timeout=120)
    code = 128 + getattr(signal, stop)
    assert process.returncode == code == {"SIGINT": KINDS["interrupted"][0], "SIGTERM": 143}[stop], err[-3000:]
    assert "Traceback" not in out + err
    (said,) = re.findall(r"^summrl: interrupted: .*$", err, re.M)
    named = {"SIGINT": "Ctrl-C or SIGINT", "SIGTERM": "SIGTERM"}[stop]
    step = int(re.fullmatch(rf"summrl: interrupted: stopped after step (\d+) \({named}\); its checkpoint is "
                            r"kept: run the same command to resume from it", said).group(1))
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["error_kind"], result["exit_code"]) == ("interrupted", "interrupted", code)
    assert 1 <= step == result["attempts"][-1]["end_step"] < 50
    assert (run_dir / "art" / "summrl" / "models" / "interrupted" / "checkpoints" / f"{step:04d}").is_dir()
    assert f"summrl/summrl/interrupted/checkpoints/{step:04d}{COMPLETE}" in keys(s3_endpoint, bucket)
    # what it reached, for summrl.report (an interrupted or failed run showed no steps or val scores)
    assert result["steps"] == step and result["final_val_score"] == result["val_history"][-1]["val_reward"]
    assert result["best_val_score"] == max(h["val_reward"] for h in result["val_history"])




def test_a_signal_while_sft_trains_keeps_its_checkpoint_with_the_stages_whole_record(tmp_path, tiny_weights):
    """Ctrl-C while SFT trained: the update went on and wrote checkpoint 1, but the run said "stopped before the first
    checkpoint", and the resume rebuilt SFT's record from its files, without its samples' rewards, teacher calls and
    $, or its figures in the history."""
    import signal

    run_dir = tmp_path / "run"
    process = tiny_training(["-c", SAVING_SLOWLY], tiny_weights, run_dir, "sftstop", 3, "sft=best_of_n",
                            "sft.max_docs=2", "sft.keep_cut_off=true")
    for line in process.stdout:
        if line == "saving\n":  # SFT's checkpoint, the run's first
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "summrl: interrupted: stopped after step 1 (Ctrl-C or SIGINT); its checkpoint is kept" in err
    model = run_dir / "art" / "summrl" / "models" / "sftstop"
    assert sorted(p.name for p in (model / "checkpoints").iterdir()) == ["0001"]
    saved = json.loads((run_dir / "sft" / "record.json").read_text())
    for key in ("samples_collected", "mean_reward_collected", "mean_reward_kept", "teacher_calls", "teacher_cost_usd"):
        assert key in saved, saved
    result = json.loads((run_dir / "result.json").read_text())
    assert result["sft"]["step"] == 1 and result["attempts"][-1]["end_step"] == 1
    rows = [json.loads(line) for line in (model / "history.jsonl").read_text().splitlines()]
    assert any(row.get("step") == 1 and "train/sft/samples_kept" in row for row in rows), rows


def test_an_interrupted_sweep_resumes_with_what_its_line_says_and_a_folder_keeps_one_run(tmp_path, tiny_weights):
    """A multirun's folder and run names defaulted to the time each job started: the line said "run the same
    command", which trained again from step 0 in a new folder, and no one run.name named every job. The jobs are now
    named for the sweep's folder, and the line names the folder. Rerun into the same folder under another name, a job
    trained from step 0 beside the first run and its result.json summed both; now that is refused."""
    import re
    import shlex
    import signal
    import subprocess

    sweep = ["-m", "summrl.train", "-m", "seed=5,6", "experiment=local", tiny_weights, "trainer.max_steps=3",
             "trainer.max_summary_tokens=8", "trainer.groups_per_step=1", "trainer.rollouts_per_group=2",
             "trainer.val_rollouts_per_doc=1", "dataset.val_size=1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, *sweep], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    for line in process.stdout:
        if line.startswith("summrl: step 1 | train"):  # job 0's; the sweep stops there
            process.send_signal(signal.SIGTERM)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-3000:]
    # step 1's, or step 2's where the signal came once its update had begun (it is finished, and recorded)
    added = re.search(r"stopped after step ([12]) \(SIGTERM\); its checkpoint is kept: run the same command with (.*) "
                      r"to resume from it", err)
    assert added, err[-3000:]
    stopped = int(added.group(1))
    (added,) = shlex.split(added.group(2))
    assert added.startswith("hydra.sweep.dir=")
    resumed = subprocess.run([sys.executable, *sweep, added], cwd=tmp_path, capture_output=True, text=True, env=env,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    folder = tmp_path / added.split("=", 1)[1]
    results = [json.loads((folder / str(n) / "result.json").read_text()) for n in (0, 1)]
    assert [(a["start_step"], a["end_step"]) for a in results[0]["attempts"]] == [(0, stopped), (stopped, 3)]  # resumed
    assert [(a["start_step"], a["end_step"]) for a in results[1]["attempts"]] == [(0, 3)]
    base = results[0]["run_name"].removesuffix("-0")
    assert results[1]["run_name"] == f"{base}-1" and base == f"{folder.parent.name}_{folder.name}"
    # the same folder under another name: refused before anything loads, the earlier record untouched
    other = subprocess.run([sys.executable, *sweep, added, "run.name=other"], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=120)
    assert other.returncode != 0
    assert (f"the run folder {folder / '0'} holds run {base}-0 (its result.json); to resume that run, add "
            f"run.name={base}, or give this one its own folder (hydra.sweep.dir=...)") in other.stdout + other.stderr
    assert json.loads((folder / "0" / "result.json").read_text()) == results[0]
    assert [p.name for p in (folder / "0" / "art" / "summrl" / "models").iterdir()] == [f"{base}-0"]



def test_a_run_folder_whose_record_trained_nothing_takes_the_corrected_command(tmp_path):
    """A first try that failed on its config or data (trainer.groups_per_step above the train split) leaves a
    record; the corrected command, under its own default name, was refused as another run."""
    from types import SimpleNamespace

    from hydra.types import RunMode

    from summrl.job import write_result
    from summrl.train import check_folder_holds_this_run

    config = SimpleNamespace(run=SimpleNamespace(name="2026-11-29_05-07-00", dir=str(tmp_path)))
    hydra_cfg = SimpleNamespace(mode=RunMode.RUN, job=SimpleNamespace(num=0))
    write_result(tmp_path, {"run_name": "2026-11-29_05-06-48", "status": "failed"})
    check_folder_holds_this_run(config, hydra_cfg)
    write_result(tmp_path, {"run_name": "2026-11-29_05-06-48", "status": "interrupted",
                            "attempts": [{"start_step": 0, "end_step": 1}]})
    with pytest.raises(ConfigError, match=r"holds run 2026-11-29_05-06-48 .* add run.name=2026-11-29_05-06-48"):
        check_folder_holds_this_run(config, hydra_cfg)


SAVING_SLOWLY = """
import runpy, sys, time
from summrl.backends.embedded.engine import Engine

save = Engine.save_checkpoint

def slowly(self, directory):  # a checkpoint that takes a while to write, as a larger model's does
    print("saving", flush=True)
    time.sleep(1.5)
    save(self, directory)

Engine.save_checkpoint = slowly
sys.argv = ["summrl.train", *sys.argv[1:]]
runpy.run_module("summrl.train", run_name="__main__")
"""


@pytest.mark.parametrize("background", [False, True])
def test_a_signal_while_a_checkpoint_is_written_keeps_the_step_with_its_records(tmp_path, tiny_weights, background):
    """SIGTERM while step 1's checkpoint was written: the write went on (on the compute thread) and finished, but the
    run said 'stopped before the first checkpoint', result.json 0 steps, and step 1's history row and trajectories
    were never written; the rerun resumed after step 1, so they were lost for good. The update is now waited for,
    and its step recorded, a second signal notwithstanding. Started in the background by a script (Ctrl-C ignored),
    the SIGTERM was ignored and the run went on training."""
    import signal

    run_dir = tmp_path / "run"
    process = tiny_training(["-c", SAVING_SLOWLY], tiny_weights, run_dir, "saving", 50, background=background)
    for line in process.stdout:
        if line == "saving\n":
            process.send_signal(signal.SIGTERM)
            # impatient, at once: it waited for the update's thread anyway, unrecorded. (Sent 0.3 s later, CI's load
            # once had it arrive before the signals were let pass: they are now from before the update starts.)
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-3000:]
    assert "Traceback" not in out + err
    assert "summrl: interrupted: stopped after step 1 (SIGTERM); its checkpoint is kept" in err
    model = run_dir / "art" / "summrl" / "models" / "saving"
    assert sorted(p.name for p in (model / "checkpoints").iterdir()) == ["0001"]
    rows = [json.loads(line) for line in (model / "history.jsonl").read_text().splitlines()]
    assert any(row.get("step") == 1 and "train/reward" in row for row in rows), rows
    assert (model / "trajectories" / "train" / "0001.parquet").exists()
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["steps"], result["attempts"][-1]["end_step"]) == ("interrupted", 1, 1)


def test_the_w_and_b_mirror_sends_whole_history_lines_only_and_skips_one_a_crash_cut_short(tmp_path):
    """ART appends history.jsonl while the run goes on: a line read half-written was a JSON error that ended the run
    (and its offset skipped the rest of it); one a crash cut short, then followed by later lines, did the same."""
    from summrl.tracking import HistoryMirror

    history = tmp_path / "history.jsonl"
    mirror = HistoryMirror(history, None)
    history.write_bytes(b'{"training_step": 1, "train/reward": 0.5}\n{"training_step": 2, "tra')
    assert mirror.new_rows() == [{"training_step": 1, "train/reward": 0.5}]
    with history.open("ab") as f:  # the line is finished; then a crash cuts one short and the resumed run goes on
        f.write(b'in/reward": 0.6}\n{"training_st\n{"training_step": 3, "train/reward": 0.7}\n')
    assert [r["training_step"] for r in mirror.new_rows()] == [2, 3]
    assert mirror.held == {"training_step": 3, "kinds": ["train"]}


def test_a_w_and_b_run_gets_every_history_row_it_lacks_and_none_twice(tmp_path):
    """Each resume sent every earlier history row again (the charts held each step two or more times); then, found by
    an audit, what the W&B run held was guessed from two figures that did not say it: a resumed run's own val pass at
    the step the W&B run ended on (a run stopped during that val pass) was dropped as held, and a W&B run first opened
    on a resumed run (trained with logger=none, or any offline invocation: each writes its own folder) never got the
    earlier steps."""
    from summrl.tracking import HELD, HistoryMirror, held_rows

    history = tmp_path / "history.jsonl"
    earlier = (b'{"training_step": 0, "val/reward": 0.2}\n{"training_step": 1, "train/reward": 0.5}\n'
               b'{"training_step": 1, "val/reward": 0.3}\n'
               b'{"training_step": 2, "train/reward": 0.6, "judge/calls": 4}\n')
    history.write_bytes(earlier)
    # a new W&B run on a run trained before: the whole history
    fresh = HistoryMirror(history, None)
    assert [(r["training_step"], sorted(r)[0]) for r in fresh.new_rows()] == [
        (0, "training_step"), (1, "train/reward"), (1, "training_step"), (2, "judge/calls")]
    # the resumed W&B run's summary holds step 2's train row: stopped during step 2's val pass, resumed
    summary = {HELD: fresh.held, "training_step": 2}
    assert summary[HELD] == {"training_step": 2, "kinds": ["judge+train"]}
    resumed = HistoryMirror(history, held_rows(summary))
    with history.open("ab") as f:
        f.write(b'{"training_step": 2, "val/reward": 0.4}\n{"training_step": 3, "train/reward": 0.7}\n')
    assert resumed.new_rows() == [{"training_step": 2, "val/reward": 0.4}, {"training_step": 3, "train/reward": 0.7}]
    # a W&B run from before summrl said what it holds: every row through its last step, as before
    legacy = HistoryMirror(history, held_rows({"training_step": 2}))
    assert [r["training_step"] for r in legacy.new_rows()] == [3]
    assert held_rows({}) == {}  # nothing logged yet


CLOSING_SLOWLY = """
import asyncio, runpy, sys
import art.local  # nest_asyncio applied before the run starts, as a sweep's later jobs of backend=local_gpu have it
from summrl.backends.embedded.backend import EmbeddedBackend

close = EmbeddedBackend.close

async def slowly(self):  # the finished run's backend takes a while to close, as vLLM's or W&B's teardown does
    print("closing", flush=True)
    await asyncio.sleep(60)  # until the test's signal: a fixed 3 s let a loaded machine send it after the exit began
    await close(self)

EmbeddedBackend.close = slowly
sys.argv = ["summrl.train", *sys.argv[1:]]
runpy.run_module("summrl.train", run_name="__main__")
"""


def test_a_signal_while_a_completed_run_closes_its_backend_leaves_it_completed(tmp_path, tiny_weights):
    """The run had finished and recorded "completed", then a SIGTERM cancelled the backend's close: it exited 143,
    said "interrupted ... run the same command to resume", and result.json gained error_kind interrupted (found by an
    audit)."""
    import signal

    run_dir = tmp_path / "run"
    process = tiny_training(["-c", CLOSING_SLOWLY], tiny_weights, run_dir, "closing", 1)
    for line in process.stdout:
        if line == "closing\n":
            process.send_signal(signal.SIGTERM)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    assert "summrl: SIGTERM while closing the backend: the run had completed" in out + err
    assert "summrl: interrupted" not in out + err
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and "error_kind" not in result and "exit_code" not in result


SIGNAL_IN_A_FINALIZER = """
import asyncio, os, signal, time
import nest_asyncio
nest_asyncio.apply()  # as importing art.local (backend=local_gpu) does, in its mp_actors, for the whole process
from summrl import cli
from summrl.errors import run_async

class Teardown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the signal arrives while a finalizer runs
        time.sleep(0.5)

async def run():
    print(asyncio.get_event_loop().run_until_complete(asyncio.sleep(0, "nested")), flush=True)  # as ART's calls do
    Teardown()
    await asyncio.sleep(20)
    print("went on")

cli.take_signals()  # as every command does: SIGTERM down Ctrl-C's path
try:
    run_async(run())
except KeyboardInterrupt:
    print("stopped")
"""


def test_a_signal_during_a_finalizer_stops_the_run_after_art_applied_nest_asyncio():
    """``import art.local`` applies nest_asyncio, whose ``asyncio.run`` installs no Ctrl-C handler: a SIGTERM that
    came while a ``__del__`` ran was printed as a KeyboardInterrupt traceback and dropped, and the run went on (CI:
    a completed run's close went on for its full 60 s, exit 0). The run's task is cancelled instead, and a loop
    ART re-enters still runs."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_FINALIZER], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["nested", "stopped"], done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


SIGNAL_AS_THE_LOOP_IS_BUILT = """
import asyncio, gc, os, signal
from asyncio.selector_events import BaseSelectorEventLoop
from summrl import cli
from summrl.errors import run_async

built = []
make_self_pipe = BaseSelectorEventLoop._make_self_pipe

def interrupted_while_building(loop):  # the signal's Python handler runs before the loop has its self-pipe
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(100_000))
    make_self_pipe(loop)
    built.append(loop)

BaseSelectorEventLoop._make_self_pipe = interrupted_while_building

async def serve():
    print("started")

cli.take_signals()  # as every command does: SIGTERM down Ctrl-C's path
try:
    run_async(serve())
except KeyboardInterrupt:
    print("stopped", len(built), built[0].is_closed())
gc.collect()
"""


def test_a_signal_as_the_event_loop_is_built_stops_with_no_traceback():
    """SIGTERM while run_async built its loop (CI: a supervisor stopping ``summrl.serve`` as it started): the loop was
    left half built, and its ``__del__`` printed an AttributeError traceback, then 'coroutine was never awaited'. The
    signal now waits for the loop to be whole, stops the run before its coroutine starts, and nothing is printed."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", SIGNAL_AS_THE_LOOP_IS_BUILT], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["stopped", "1", "True"], done.stdout + done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]


def test_a_resumed_invocation_that_stops_early_keeps_the_runs_spend_and_figures(tmp_path):
    """Stopped before its session existed (SIGTERM while loading, a config or network error), a resume wrote its own
    fields alone: the run's judge calls and $, rollouts and val figures were gone, and the next resume counted from
    0. The question writer's $ was 0 on every resume, read from the cache (found by an audit)."""
    from summrl.job import RunRecord, write_result
    from summrl.loop import with_earlier_question_cost

    first = {"status": "completed", "steps": 4, "judge_calls": 18.0, "judge_cost_usd": 0.00077,
             "rollouts": {"scored": 12, "missing": 0}, "best_val_score": 0.4, "final_val_score": 0.35,
             "dataset": {"kind": "documents", "questions": {"cost_usd": 0.00112, "written_now": 6}},
             "error": "", "wall_s": 90.0, "val_history": [{"step": 4, "val_reward": 0.35}]}
    write_result(tmp_path, first)
    record = RunRecord(tmp_path)
    record.update(status="running", run_name="r")  # as the loop does: its fields, then its record saved on the way out
    record.update(status="interrupted", error="KeyboardInterrupt: ")
    record.save()
    record.fail("interrupted", "interrupted: stopped before the first checkpoint (SIGTERM)", 143)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert (saved["judge_calls"], saved["judge_cost_usd"], saved["rollouts"]) == (18.0, 0.00077, first["rollouts"])
    # a judge reply without token counts is counted as such: its $ is unknown, not the $0 litellm gives it
    from types import SimpleNamespace

    from summrl.loop import run_totals

    missing = SimpleNamespace(record=lambda: {"scored": 2, "missing": 0, "missing_by_error": {}})
    session = SimpleNamespace(judge_totals={"judge/calls": 3.0, "judge/cost_usd": 0.0, "judge/unpriced_calls": 3.0},
                              missing=missing)
    totals = run_totals(session, SimpleNamespace(earlier={**saved, "judge_unpriced_calls": 1.0}))
    assert (totals["judge_calls"], totals["judge_unpriced_calls"], totals["judge_cost_usd"]) == (21.0, 4.0, 0.00077)
    assert (saved["best_val_score"], saved["status"], saved["exit_code"]) == (0.4, "interrupted", 143)
    resumed = {"kind": "documents", "questions": {"cost_usd": 0.0, "written_now": 0}}
    assert with_earlier_question_cost(resumed, saved)["questions"]["cost_usd"] == pytest.approx(0.00112)
    assert with_earlier_question_cost(resumed, {}) == resumed
    # an online invocation (dataset=inbox) keeps the val digest the run trained with, which a later resume on the
    # documents is checked against: its record has none, and the check was skipped from then on (found by an audit)
    inbox_record = {"kind": "inbox", "recorded": 0, "documents": 0}
    trained = {"dataset": {"kind": "documents", "val_sha256": "0a831d8883322622"}}
    assert with_earlier_question_cost(inbox_record, trained) == {**inbox_record, "val_sha256": "0a831d8883322622"}
    # an inbox with documents has a val set of its own: its digest is kept beside the run's, not over it
    assert with_earlier_question_cost({**inbox_record, "val_sha256": "inbox"}, trained) == {
        **inbox_record, "val_sha256": "0a831d8883322622", "inbox_val_sha256": "inbox"}
    later = with_earlier_question_cost({**inbox_record, "val_sha256": "inbox2"}, {"dataset": {
        **inbox_record, "val_sha256": "0a831d8883322622", "inbox_val_sha256": "inbox"}})
    assert (later["val_sha256"], later["inbox_val_sha256"]) == ("0a831d8883322622", "inbox2")
    assert with_earlier_question_cost({"kind": "documents", "val_sha256": "new"}, trained)["val_sha256"] == "new"



def test_a_checkpoint_killed_before_its_record_is_said_when_the_run_resumes_from_it(tmp_path):
    """kill -9 between a step's checkpoint and its record: the resume went on from the checkpoint, and nothing said
    that the step's metrics, rollouts and judge spend were missing from every record."""
    from summrl.loop import history_path, unrecorded_checkpoint
    from tests.conftest import compose_config

    config = compose_config(["experiment=local", "run.name=r", f"run.dir={tmp_path}"])
    path = history_path(config)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"training_step": 0, "val/reward": 0.2}) + "\n"
                    + json.dumps({"training_step": 1, "train/reward": 0.3}) + "\n"
                    + json.dumps({"training_step": 2, "val/reward": 0.4}) + "\n")
    assert unrecorded_checkpoint(config, 0) is None and unrecorded_checkpoint(config, 1) is None
    assert unrecorded_checkpoint(config, 2).startswith(f"summrl: warning: checkpoint 2 has no training row in {path}: "
                                                       "the run was killed after writing it and before recording it")


def test_a_resume_with_other_val_reward_or_model_settings_is_refused_before_anything_is_written(tmp_path, caplog):
    """Nothing compared a resume's config with the one the run trained with: dataset.seed=7 seed=3 went through, its
    val scores were ranked with the earlier ones (step=best) though measured on other documents (found by an
    audit)."""
    from summrl.errors import ConfigError
    from summrl.job import JobInfo, RunRecord, write_result
    from summrl.loop import check_resumed_as_trained
    from summrl.tracking import flat_config
    from tests.conftest import compose_config

    trained = compose_config(["experiment=local", "run.name=r"])
    earlier = {"status": "completed", "config": flat_config(trained, JobInfo(choices={"reward": "qa"})),
               "attempts": [{"attempt": 1, "start_step": 0, "end_step": 2}], "val_history": [{"step": 2}]}
    write_result(tmp_path, earlier)
    for overrides in (["trainer.max_steps=40", "dataset.train_size=all", "judge.cache_dir=null"],  # may change
                      []):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", *overrides]), RunRecord(tmp_path))
    # another train size reshuffles the documents from the resume on: allowed, and said
    assert "dataset.train_size=all, trained with 32: the train documents are shuffled again" in caplog.text
    # more groups than train documents: a step trained fewer than the records said
    from summrl.loop import check_groups_fit

    with pytest.raises(ConfigError, match=r"^trainer.groups_per_step=5: the train split has 2 document\(s\), so a step "
                                          r"would train 2 group\(s\): set trainer.groups_per_step=2 or less"):
        check_groups_fit(compose_config(["experiment=local", "trainer.groups_per_step=5"]), 2)
    check_groups_fit(compose_config(["experiment=local", "trainer.groups_per_step=2"]), 2)
    # a run an earlier summrl trained so resumes (its resume must keep groups_per_step), with a warning
    check_groups_fit(compose_config(["experiment=local", "trainer.groups_per_step=5"]), 2,
                     {"attempts": [{"end_step": 1}], "config": {"trainer.groups_per_step": 5}})
    assert "trainer.groups_per_step=5 is more than the 2 train document(s)" in caplog.text
    # trainer.val_temperature=null draws val at trainer.temperature: another one ranked other draws with the earlier
    with pytest.raises(ConfigError, match=r"trained with trainer.temperature=1.0 \(now 0.5\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "trainer.temperature=0.5"]),
                                 RunRecord(tmp_path))
    # val drawn with another token budget, ranked with the earlier passes (step=best; a sweeps audit)
    with pytest.raises(ConfigError, match=r"trained with trainer.max_summary_tokens=128 \(now 48\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "trainer.max_summary_tokens=48"]),
                                 RunRecord(tmp_path))
    # another groups_per_step went on from another document: some trained twice in the epoch, others skipped
    with pytest.raises(ConfigError, match=r"trained with trainer.groups_per_step=2 \(now 3\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "trainer.groups_per_step=3"]),
                                 RunRecord(tmp_path))
    with pytest.raises(ConfigError, match=r"^run.name=r resumes a run trained with dataset.seed=80 \(now 7\), seed="
                                          r"\S+ \(now 3\), trainer.prompt=facts \(now summary_rl\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "dataset.seed=7", "seed=3",
                                                 "trainer.prompt=summary_rl"]), RunRecord(tmp_path))
    with pytest.raises(ConfigError, match=r"trained with reward=qa \(now length_penalized\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "reward=length_penalized"]),
                                 RunRecord(tmp_path, JobInfo(choices={"reward": "length_penalized"})))
    # SFT added or dropped: dropped, the SFT checkpoint counted as a GRPO step; added, SFT ran on top of the GRPO steps
    # and every GRPO step ran again (found by this stop's SFT audit)
    with pytest.raises(ConfigError, match=r"trained with sft.kind=none \(now best_of_n\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "sft=best_of_n"]),
                                 RunRecord(tmp_path))
    best_of_n = JobInfo(choices={"sft": "best_of_n"})
    write_result(tmp_path, {**earlier, "config": flat_config(compose_config(["experiment=local", "run.name=r",
                                                                               "sft=best_of_n"]), best_of_n)})
    with pytest.raises(ConfigError, match=r"trained with sft=best_of_n \(now none\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r"]),
                                 RunRecord(tmp_path, JobInfo(choices={"sft": "none"})))
    check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "sft=best_of_n", "sft.epochs=2"]),
                             RunRecord(tmp_path, best_of_n))  # the stage's other settings: SFT is never redone
    write_result(tmp_path, earlier)
    assert json.loads((tmp_path / "result.json").read_text()) == json.loads(json.dumps(earlier))  # untouched
    # a setting another summrl version added (or removed) is no change of the run's
    record = RunRecord(tmp_path)
    record.earlier["config"] = {k: v for k, v in earlier["config"].items() if k != "trainer.val_temperature"}
    record.earlier["config"]["reward.retired_setting"] = 1
    check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "trainer.val_temperature=0.5"]), record)
    # but val QA's rules, which a record from before trainer.val_qa_* says through its reward (or the defaults)
    ruler = JobInfo(choices={"reward": "ruler"})
    before = {k: v for k, v in flat_config(compose_config(["experiment=local", "run.name=r", "reward=ruler"]),
                                           ruler).items() if not k.startswith("trainer.val_qa_")}
    write_result(tmp_path, {**earlier, "config": before})
    check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "reward=ruler"]),
                             RunRecord(tmp_path, ruler))
    with pytest.raises(ConfigError, match=r"trained with trainer.val_qa_forbid_han=True \(now False\): its"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "reward=ruler",
                                                 "trainer.val_qa_forbid_han=false"]), RunRecord(tmp_path, ruler))
    # dataset=documents: other question settings write other questions for the val documents (found by an audit)
    documents = ["experiment=local", "run.name=r", "dataset=documents", f"dataset.path={tmp_path}"]
    write_result(tmp_path, {**earlier, "config": flat_config(compose_config(documents), JobInfo())})
    check_resumed_as_trained(compose_config([*documents, "dataset.questions.confirm=false",
                                             "dataset.questions.max_cost_usd=1"]), RunRecord(tmp_path))
    with pytest.raises(ConfigError, match=r"trained with dataset.questions.per_document=5 \(now 3\): its"):
        check_resumed_as_trained(compose_config([*documents, "dataset.questions.per_document=3"]), RunRecord(tmp_path))
    write_result(tmp_path, earlier)
    # online learning (dataset=inbox) goes on from any run, with its own val set (test_serve's online loop)
    inbox = JobInfo(choices={"dataset": "inbox"})
    check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "dataset=inbox", "seed=3",
                                             "trainer.groups_per_step=3", "trainer.temperature=0.5"]),
                             RunRecord(tmp_path, inbox))
    # but on the run's adapter: another LoRA rank (the run's model overrides left out) wrote the inbox's questions,
    # paid, then failed to load the adapter with a traceback (found by this stop's inbox audit)
    with pytest.raises(ConfigError, match=r"trained with model.lora.r=16 \(now 4\): its checkpoints"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "dataset=inbox", "model.lora.r=4"]),
                                 RunRecord(tmp_path, inbox))
    with pytest.raises(ConfigError, match=r"trained with trainer.prompt=facts \(now summary_rl\)"):
        check_resumed_as_trained(compose_config(["experiment=local", "run.name=r", "dataset=inbox",
                                                 "trainer.prompt=summary_rl"]), RunRecord(tmp_path, inbox))


@pytest.mark.parametrize("sft", [[], ["sft=best_of_n", "sft.max_docs=1", "sft.samples_per_doc=2",
                                       "sft.keep_cut_off=true"]])
def test_a_rerun_of_a_finished_run_adds_no_attempt_and_none_of_its_time(sft, tmp_path, tiny_weights):
    """A sweep rerun after a crash runs its finished jobs again: each loaded its model, trained nothing, and added an
    attempt of 0 steps and its time to wall_s, so summrl.report's minutes for that job grew with every rerun (found
    by this stop's crash audit: 10.5, 17.7, 25.6 s; with SFT, by its review)."""
    import asyncio

    from summrl.job import RunRecord, read_result
    from summrl.loop import train
    from tests.conftest import compose_config

    config = compose_config(["experiment=local", tiny_weights, "run.name=r", f"run.dir={tmp_path}",
                             "trainer.max_steps=1", "dataset.val_size=1", "trainer.val_rollouts_per_doc=1",
                             "trainer.max_summary_tokens=4", *sft])
    asyncio.run(train(config, record := RunRecord(tmp_path)))
    record.save()
    # the run's peak as a separate process would have measured it, above this test process's: the rerun, which loads
    # less, put its own lower peak in its place (2.0 -> 0.75 GB in a sweeps audit)
    from summrl.job import write_result

    write_result(tmp_path, {**read_result(tmp_path), "peak_rss_gb": 99.0})
    first = read_result(tmp_path)
    asyncio.run(train(config, record := RunRecord(tmp_path)))
    record.save()
    again = read_result(tmp_path)
    assert again["status"] == "completed" and again["steps"] == 1 + bool(sft)
    assert again["val_history"] == first["val_history"]
    assert again["attempts"] == first["attempts"] and again["wall_s"] == first["wall_s"]
    assert again["peak_rss_gb"] == 99.0


def test_a_resume_refused_by_a_config_error_leaves_the_completed_run_completed(tmp_path):
    """Found by an audit: a resume refused inside the loop (here, its val documents are others; also a summary
    budget past the policy's context, once the model loaded) wrote status "failed" with its error over a completed
    run's record, and summrl.report left the run out of its statistics (and W&B showed it failed)."""
    import asyncio

    from summrl.errors import ConfigError
    from summrl.job import JobInfo, RunRecord, read_result, write_result
    from summrl.loop import train
    from summrl.tracking import flat_config
    from tests.conftest import compose_config

    config = compose_config(["experiment=local", "run.name=r", f"run.dir={tmp_path}"])
    earlier = {"status": "completed", "config": flat_config(config, JobInfo()), "steps": 2, "final_val_score": 0.4,
               "attempts": [{"attempt": 1, "start_step": 0, "end_step": 2}], "val_history": [{"step": 2}],
               "dataset": {"val_sha256": "the digest of other documents"}, "wall_s": 60.0}
    write_result(tmp_path, earlier)
    record = RunRecord(tmp_path)
    with pytest.raises(ConfigError, match="resumes a run whose val documents were others"):
        asyncio.run(train(config, record))
    record.fail("config", "config error: ...", 2)  # as summrl.train finishes a failed job
    result = read_result(tmp_path)
    assert (result["status"], result["steps"], result["final_val_score"]) == ("completed", 2, 0.4)
    assert "error" not in result and "error_kind" not in result and result["wall_s"] == 60.0
    # Ctrl-C while a rerun of the completed run loads its model: the run is as it was (it read "interrupted")
    import summrl.loop

    async def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    write_result(tmp_path, {k: v for k, v in earlier.items() if k != "dataset"})
    record = RunRecord(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(summrl.loop, "open_session", stopped)
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(train(config, record))
    record.fail("interrupted", record.interruption(), 130)
    assert "nothing was trained, and result.json is as the run's last invocation left it (completed, step 2)" in (
        record.interruption())
    result = read_result(tmp_path)
    assert (result["status"], result["steps"], result["wall_s"]) == ("completed", 2, 60.0) and "error" not in result
    # a first invocation refused so is a failed run, as before
    fresh = tmp_path / "fresh"
    config = compose_config(["experiment=local", "run.name=f", f"run.dir={fresh}", "trainer.groups_per_step=999"])
    record = RunRecord(fresh)
    with pytest.raises(ConfigError, match="trainer.groups_per_step=999"):
        asyncio.run(train(config, record))
    assert read_result(fresh)["status"] == "failed"


def test_an_argument_without_equals_is_a_config_error_and_a_key_typed_as_a_value_is_masked(tmp_path):
    """A run folder passed as summrl.report takes one (summrl.export runs/x) ended in Hydra's grammar error with exit 1,
    the code of a bug; a key pasted as another setting's value was printed whole in the config error's line (found
    by this stop's CLI audit)."""
    secret = "AIzaSyFAKEKEY1234567890abcdefghijklmno"
    bare = run_cli_module("summrl.export", [str(tmp_path)], {})
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr
    assert f"summrl: config error: can't read the override '{tmp_path}': each argument is key=value" in bare.stderr
    assert "run_dir=<folder> for serve and export" in bare.stderr
    # the training command's experiment= passed again: Hydra's fix (+experiment=local) failed in turn
    again = run_cli_module("summrl.export", [f"run_dir={tmp_path}", "experiment=local"], {})
    assert again.returncode == 2 and "summrl: config error: experiment: this command has no such config group" in \
        again.stderr, again.stderr
    pasted = run_cli([f"trainer.max_steps={secret}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                     env={"GEMINI_API_KEY": secret})
    assert pasted.returncode == 2 and "summrl: config error: trainer.max_steps: Value '***'" in pasted.stderr
    assert secret not in pasted.stderr + pasted.stdout
    # a key whose variable's name says nothing of a key: named by judge.api_key_env (found by this stop's secrets
    # audit: masked only once the typed config named it, after Hydra's own error had printed it)
    plain = "PLANTEDmyjudge0009abcdef"
    pasted = run_cli(["experiment=local", "judge=openai_compatible", "judge.api_key_env=MYJUDGE",
                      f"trainer.max_steps={plain}", f"hydra.run.dir={tmp_path / 'run2'}"], cwd=ROOT,
                     env={"MYJUDGE": plain})
    assert pasted.returncode == 2 and "summrl: config error: trainer.max_steps: Value '***'" in pasted.stderr
    assert plain not in pasted.stderr + pasted.stdout


def test_a_run_folders_saved_config_that_cant_be_read_is_one_line_naming_it(tmp_path):
    """serve, export and the benchmark read the run's .hydra/trained.yaml: one cut short ended in yaml's traceback,
    and an empty one in "dataset is not in the config ... add it with +dataset=<value>" (found by this stop's CLI
    audit)."""
    import re

    from summrl.checkpoints import load_trained
    from summrl.errors import ConfigError

    saved = tmp_path / "trained.yaml"
    for text, said in (("model: [\n", r"can't be read \(while parsing"), ("", r"is not a training config \(it has no "
                                                                          r"model, dataset\)"),
                       ("- a\n- b\n", r"is not a training config")):
        saved.write_text(text)
        with pytest.raises(ConfigError, match=rf"^run_dir: {re.escape(str(saved))} {said}.*point run_dir at a "
                                              r"training run folder"):
            load_trained(saved, "run_dir", ("model", "dataset"))
    saved.write_text("model:\n  base_model: m\ndataset:\n  kind: repliqa\n")
    assert load_trained(saved, "run_dir", ("model", "dataset")).model.base_model == "m"
