"""One line and a documented exit code per expected failure, as a user sees them (subprocesses of
`python -m summrl.train`), and the classification behind them on the libraries' real exceptions."""

from __future__ import annotations

import json
import os
import sys

import pytest

from summrl.errors import KINDS, classify
from tests.conftest import ROOT, run_cli

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
def test_a_judge_that_refuses_the_key_ends_the_run_with_one_judge_line(tmp_path):
    from summrl.judges.fake_server import FakeLLM, Reply

    run_dir = tmp_path / "run"
    with FakeLLM() as fake:
        fake.script = [Reply(status=401)] * 200
        result = run_cli(["experiment=local", "judge=openai_compatible", "judge.model=openai/fake-judge",
                          f"judge.api_base={fake.base_url}/v1", "judge.api_key_env=FAKE_JUDGE_KEY", "judge.cache_dir=null",
                          "trainer.max_steps=1", "trainer.max_summary_tokens=8", "dataset.val_size=1",
                          f"hydra.run.dir={run_dir}"],
                         cwd=ROOT, timeout=600, env={"FAKE_JUDGE_KEY": "sk-planted-judge-41"})
    assert result.returncode == KINDS["judge"][0] == 4, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith("summrl: judge error: ") and "have no reward" in line
    assert line.count("fake-judge") == 1  # named once
    assert "Traceback" not in result.stderr and "sk-planted-judge-41" not in result.stdout + result.stderr
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["error_kind"] == "judge" and record["exit_code"] == 4
    assert "MissingRewardsError" in record["error"]


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
    assert len({code for code, _ in KINDS.values()}) == len(KINDS)  # one exit code per kind


def test_the_readme_documents_every_exit_code():
    readme = (ROOT / "README.md").read_text()
    for kind, (code, label) in KINDS.items():
        assert f"| {code} | {label}" in readme, kind


def test_wandb_mode_from_the_environment_unless_logger_mode_says(monkeypatch, tmp_path):
    from summrl.tracking import open_tracker
    from tests.conftest import compose_config

    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)  # would go online under logger.mode=auto, without WANDB_MODE
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = compose_config(["experiment=local", "logger=wandb", f"run.dir={tmp_path}", "run.name=modes"])
    tracker = open_tracker(config, None, tmp_path / "history.jsonl")
    try:
        assert tracker.run.settings.mode == "offline" and tracker.run.offline
    finally:
        tracker.finish(failed=False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = compose_config(["experiment=local", "logger=wandb", "logger.mode=offline", f"run.dir={tmp_path}",
                             "run.name=modes2"])
    tracker = open_tracker(config, None, tmp_path / "history.jsonl")  # the explicit mode wins over the environment
    try:
        assert tracker.run.offline and not tracker.run.disabled
    finally:
        tracker.finish(failed=False)
