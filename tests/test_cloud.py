"""backend=skypilot: the SkyPilot task, its secrets, the preflight and the cluster lifecycle.

The task is built and validated by SkyPilot itself, offline, against a two-line RunPod catalog
(tests/fixtures/sky_catalog). Only SkyPilot's network calls (launch and its request stream, tail_logs,
cancel, down) are replaced, by a recorder.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, compose_config, said

# SkyPilot fixes its runtime dir (catalogs, state) at import: point it at a private copy of the fixture catalog.
SKY_RUNTIME = Path(tempfile.mkdtemp(prefix="summrl-sky-"))
shutil.copytree(ROOT / "tests" / "fixtures" / "sky_catalog", SKY_RUNTIME / ".sky" / "catalogs" / "v8")
assert "sky" not in sys.modules, "tests/test_cloud.py must import skypilot first (its runtime dir is set at import)"
_previous = os.environ.get("SKY_RUNTIME_DIR")
os.environ["SKY_RUNTIME_DIR"] = str(SKY_RUNTIME)
import sky  # noqa: E402
from sky.data import storage_utils  # noqa: E402

if _previous is None:
    del os.environ["SKY_RUNTIME_DIR"]
else:
    os.environ["SKY_RUNTIME_DIR"] = _previous

from summrl.cloud import launch  # noqa: E402
from tests.conftest import s3  # noqa: E402  (s3_endpoint, a real S3 endpoint on loopback, is a conftest fixture)
from summrl.cloud.launch import PreflightError, RemoteJobFailed, build_task, run_on_cluster  # noqa: E402

PLANTED = {
    "GEMINI_API_KEY": "planted-gemini-7Qx2",
    "AWS_ACCESS_KEY_ID": "planted-akid-9Lm4",
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-3Zt8",
    "WANDB_API_KEY": "planted-wandb-5Rv1",
    "OPENPIPE_API_KEY": "planted-openpipe-2Kp6",
    "BACKUP_BUCKET": "planted-bucket-8Hn3",
}
RUNPOD_KEY = "planted-runpod-4Wd9"


@pytest.fixture
def cloud_env(tmp_path, monkeypatch):
    """A home with RunPod credentials, and every key set (to planted values)."""
    home = tmp_path / "home"
    (home / ".runpod").mkdir(parents=True)
    (home / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{RUNPOD_KEY}"\n')
    monkeypatch.setenv("HOME", str(home))
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    return home


class FakeSky:
    """Records SkyPilot's network calls; the job ends with ``exit_code`` (or Ctrl-C with ``interrupt``)."""

    def __init__(self, monkeypatch, exit_code=0, interrupt=False, interrupt_provisioning=False):
        self.calls, self.exit_code, self.interrupt = [], exit_code, interrupt
        self.interrupt_provisioning = interrupt_provisioning
        for name in ("launch", "stream_and_get", "tail_logs", "cancel", "down", "get", "api_cancel"):
            monkeypatch.setattr(sky, name, getattr(self, name))
        # this fake cluster is this machine: S3 on its loopback (moto, s3_endpoint) reaches it
        monkeypatch.setattr(launch, "on_this_machine_only", lambda host: False)

    def launch(self, task, **kwargs):
        self.calls.append(("launch", task, kwargs))
        return "launch-request"

    def stream_and_get(self, request):
        self.calls.append(("stream_and_get", request))
        if self.interrupt_provisioning:
            raise KeyboardInterrupt
        return (7, "handle") if request == "launch-request" else None

    def tail_logs(self, cluster, job_id, follow):
        self.calls.append(("tail_logs", cluster, job_id, follow))
        if self.interrupt:
            raise KeyboardInterrupt
        return self.exit_code

    def cancel(self, cluster, job_ids):
        self.calls.append(("cancel", cluster, job_ids))
        return "cancel-request"

    def api_cancel(self, request, silent=False):
        self.calls.append(("api_cancel", request))
        return "api-cancel-request"

    def down(self, cluster):
        self.calls.append(("down", cluster))
        return "down-request"

    def get(self, request):
        self.calls.append(("get", request))

    def names(self):
        return [c[0] for c in self.calls]


def default_config(*overrides):
    return compose_config(["run.name=summary-rl", *overrides])


def launcher_config(*overrides):
    """The defaults with backups off, so that the launcher reads nothing back from S3 after the job."""
    return default_config("storage.enabled=false", *overrides)


def test_default_task_targets_one_h100_on_runpod_and_validates_offline(cloud_env):
    task = build_task(default_config(), ["model.lr=1e-05"], "summrl")
    task.validate()
    (resources,) = task.resources
    assert str(resources.cloud) == "RunPod" and resources.accelerators == {"H100": 1}
    assert resources.disk_size == 100
    assert task.workdir == str(ROOT)
    assert "uv pip install --python .venv/bin/python -e '.[gpu]'" in task.setup
    assert "ensure_vllm_runtime()" in task.setup.splitlines()[-1]
    assert task.run.splitlines()[-1] == (
        "python -m summrl.train model.lr=1e-05 dataset.train_size=3500 dataset.val_size=91 run.name=summary-rl "
        "backend=local_gpu backend.gpu_memory_utilization=0.8 backend.enforce_eager=false backend.load_in_4bit=true "
        "backend.max_seq_length=32768 hydra.mode=RUN")


def test_task_resources_and_remote_engine_args_follow_config(cloud_env):
    overrides = ["backend.accelerators=A100-80GB:1", "backend.local_gpu.gpu_memory_utilization=0.6",
                 "backend.local_gpu.max_model_len=8192", "+backend.local_gpu.engine_args.max_num_seqs=64",
                 "run.name=summary-rl", "seed=3"]
    config = default_config(*overrides)
    task = build_task(config, overrides, "summrl")
    task.validate()
    assert next(iter(task.resources)).accelerators == {"A100-80GB": 1}
    command = task.run.splitlines()[-1]
    # The launcher's own settings stay here; the remote job gets backend=local_gpu with the nested engine args.
    assert "backend.accelerators" not in command and command.count("run.name=") == 1
    assert "seed=3" in command and "backend.gpu_memory_utilization=0.6" in command
    assert "backend.max_model_len=8192" in command
    # The remote command composes, as it will on the cluster, into this job with backend=local_gpu.
    remote = compose_config(shlex.split(command)[3:])
    assert remote.backend.kind == "local_gpu" and remote.run.name == "summary-rl" and remote.seed == 3
    assert (remote.backend.gpu_memory_utilization, remote.backend.max_model_len) == (0.6, 8192)
    assert remote.backend.engine_args == {"max_num_seqs": 64}


def test_engine_args_of_any_shape_reach_the_cloud_job_as_given(cloud_env):
    """A mapping was written as JSON, whose quoted keys Hydra can't parse, and a comma in a string split it: the
    remote job stopped at its first line, after the paid setup (found by an audit)."""
    overrides = ["+backend.local_gpu.engine_args.hf_overrides={rope_theta: 1000000}",
                 "+backend.local_gpu.engine_args.served_model_name='a,b'",
                 "+backend.local_gpu.engine_args.tokenizer_mode=auto", "+backend.local_gpu.engine_args.seed='7'"]
    command = build_task(default_config(*overrides), overrides, "summrl", resources=False).run.splitlines()[-1]
    remote = compose_config(shlex.split(command)[3:])
    assert remote.backend.engine_args == {"hf_overrides": {"rope_theta": 1000000}, "served_model_name": "a,b",
                                          "tokenizer_mode": "auto", "seed": "7"}


def test_a_preset_that_sweeps_runs_on_the_cluster_as_the_one_run_submitted(cloud_env):
    """experiment=reward_ablation sets hydra.mode: MULTIRUN: the remote command made the job a sweep of one, which
    renamed its run (<name>-0), so sweep status, pull and the report found nothing under the name submitted (found
    by an audit)."""
    import subprocess

    overrides = ["experiment=reward_ablation", "reward=qa", "model.lr=1e-05"]
    command = build_task(default_config(*overrides), overrides, "summrl", resources=False).run.splitlines()[-1]
    args = shlex.split(command)[3:]
    printed = subprocess.run([sys.executable, "-m", "summrl.train", *args, "--cfg", "hydra"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    hydra = yaml.safe_load(printed.stdout)["hydra"]
    assert hydra["mode"] == "RUN" and "run.name=summary-rl" in hydra["overrides"]["task"]


def test_a_secret_resolved_into_the_tasks_commands_is_refused_before_launch(cloud_env, monkeypatch):
    """${oc.env:HF_TOKEN} in backend.setup or an engine arg was resolved here: the token was in clear in the task
    (SkyPilot's YAML, the printed dry run, train.log) (found by an audit)."""
    from summrl.errors import ConfigError

    monkeypatch.setenv("HF_TOKEN", "hf_PLANTEDsecret123456")
    fake = FakeSky(monkeypatch)
    for override, where in (("backend.setup='huggingface-cli login --token ${oc.env:HF_TOKEN}'", "backend.setup"),
                            ("+backend.local_gpu.engine_args.hf_token=${oc.env:HF_TOKEN}", "the cloud job's command")):
        with pytest.raises(ConfigError, match=rf"^{where}.* holds the value of HF_TOKEN: .* write \$HF_TOKEN") as e:
            run_on_cluster(launcher_config(override), [override], None)
        assert "hf_PLANTED" not in str(e.value)
    # a variable the override reads, whatever its name: the task forwards it as a secret, and it was in clear too
    monkeypatch.setenv("MY_HF", "hf_VIAENV4242")
    for override, where in (("backend.setup='huggingface-cli login --token ${oc.env:MY_HF}'", "backend.setup"),
                            ("+backend.local_gpu.engine_args.hf_token=${oc.env:MY_HF}", "the cloud job's command")):
        with pytest.raises(ConfigError, match=rf"^{where}.* holds the value of MY_HF: .* write \$MY_HF") as e:
            run_on_cluster(launcher_config(override), [override], None)
        assert "hf_VIAENV" not in str(e.value)
    # ...but a variable meant to be in the command (a run name, a W&B project, a split) launches, whole words only
    for name, value, override in (("EXPERIMENT", "alice", "run.name=${oc.env:EXPERIMENT}-lr"),
                                  ("WANDB_PROJECT", "summrl", "project=${oc.env:WANDB_PROJECT}"),
                                  ("SPLIT", "train", "dataset.hf_split=${oc.env:SPLIT}")):
        monkeypatch.setenv(name, value)
        build_task(launcher_config(override), [override], "summrl", resources=False)
    assert fake.calls == []
    # the way the message names: the variable, read on the cluster from the task's secrets
    override = "backend.setup='huggingface-cli login --token $HF_TOKEN'"
    task = build_task(launcher_config(override), [override], "summrl", resources=False)
    assert "--token $HF_TOKEN" in task.setup and task.secrets["HF_TOKEN"].get_secret_value() == "hf_PLANTEDsecret123456"


def test_the_preflight_follows_the_candidates_and_refuses_a_judge_on_loopback(tmp_path, monkeypatch):
    """The RunPod key was asked for by backend.infra even when the candidates replace it; a judge on localhost
    passed, and the cluster reached itself there after its paid setup (found by an audit)."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no RunPod key
    elsewhere = "backend.candidates=[{infra: lambda, accelerators: 'H100:1'}, {infra: aws, accelerators: 'H100:1'}]"
    assert not any("runpod" in p for p in launch.preflight(launcher_config(elsewhere)))
    on_runpod = "backend.candidates=[{infra: aws, accelerators: 'H100:1'}, {infra: runpod, accelerators: 'H100:1'}]"
    assert any(".runpod/config.toml" in p for p in launch.preflight(launcher_config(on_runpod)))
    judge = ["judge=openai_compatible", "judge.model=openai/j", "judge.api_base=http://localhost:8000/v1"]
    assert any(p.startswith("judge.api_base=http://localhost:8000/v1 is on this machine (loopback)")
               for p in launch.preflight(launcher_config(*judge)))
    judge[-1] = "judge.api_base=http://judge.example.org:8000/v1"
    assert not any("loopback" in p for p in launch.preflight(launcher_config(*judge)))
    # S3 on this machine (MinIO, moto) passed too: the job failed at its bucket check, after provisioning and setup
    s3_here = ["storage.enabled=true", "storage.bucket=runs", "storage.endpoint_url=http://127.0.0.1:9000"]
    assert any(p.startswith("storage.endpoint_url=http://127.0.0.1:9000 is on this machine (loopback)")
               for p in launch.preflight(launcher_config(*s3_here)))
    assert not any("loopback" in p for p in launch.preflight(launcher_config(*s3_here, "storage.enabled=false")))
    # each passed here and failed on the cluster after its paid setup (found by an audit): a judge model litellm
    # can't place (the remote job's own preflight refuses it), and documents in a folder .skyignore leaves out
    assert any(p.startswith("judge.model=gemini-2.5-flashh: litellm can't tell which provider serves it")
               for p in launch.preflight(launcher_config("judge.model=gemini-2.5-flashh")))
    assert not any("litellm can't tell" in p for p in launch.preflight(launcher_config()))
    docs = ROOT / "outputs" / f"audit-docs-{os.getpid()}"
    docs.mkdir(parents=True)
    try:
        (docs / "a.txt").write_text("The depot opened in 2021 with 40 staff members.")
        found = [p for p in launch.preflight(launcher_config("dataset=documents", f"dataset.path={docs}",
                                                             "dataset.questions.confirm=false"))
                 if p.startswith("dataset.path=")]
        assert found == [f"dataset.path={docs} is in outputs/, which .skyignore leaves out of what SkyPilot copies to "
                         "the cluster (run outputs, environments, caches): move (or copy) the documents into another "
                         "folder of the project"]
        uploaded = launcher_config("dataset=documents", "dataset.path=tests/fixtures/documents",
                                   "dataset.questions.confirm=false")
        assert not [p for p in launch.preflight(uploaded) if p.startswith("dataset.path=")]
    finally:
        shutil.rmtree(docs)


def test_a_cloud_run_without_backups_is_warned_that_it_stays_on_the_cluster(cloud_env, monkeypatch, caplog):
    FakeSky(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="summrl"):
        run_on_cluster(launcher_config(), [], None)
    assert "storage.enabled=false: the run's checkpoints and result.json stay on the cluster" in caplog.text


def test_an_unknown_accelerator_fails_validation_before_launch(cloud_env, monkeypatch):
    fake = FakeSky(monkeypatch)
    with pytest.raises(PreflightError, match="backend.accelerators=H200-TYPO:1 is not offered on runpod"):
        run_on_cluster(launcher_config("backend.accelerators=H200-TYPO:1"), [], None)
    assert "launch" not in fake.names()


def test_planted_secrets_are_only_in_the_secrets_mapping(cloud_env, monkeypatch, caplog, capfd, s3_endpoint):
    fake = FakeSky(monkeypatch)
    caplog.set_level(logging.DEBUG)
    # The launcher reads the run's result back from the (loopback) bucket named by BACKUP_BUCKET.
    run_on_cluster(default_config(f"storage.endpoint_url={s3_endpoint}"), ["seed=3"], None)
    task = fake.calls[0][1]
    assert {k: v.get_secret_value() for k, v in task.secrets.items()} == PLANTED
    assert not task.envs
    out, err = capfd.readouterr()
    task_text = "\n".join([task.setup, task.run, launch.describe(task)])
    ours = "\n".join(line for line in (out + err).splitlines() if line.startswith("summrl"))
    for value in [*PLANTED.values(), RUNPOD_KEY]:
        assert value not in task_text + ours
        # Every log line too (the loopback S3 server's access log and urllib3 name the bucket in request URLs).
        if value != PLANTED["BACKUP_BUCKET"]:
            assert value not in out + err + caplog.text
    assert "<redacted>" in launch.describe(task)


def test_a_variable_an_override_reads_travels_as_a_secret_and_the_command_keeps_the_reference(cloud_env, monkeypatch):
    """The override as typed reaches the remote command (resolved here, its value was in the task's run script);
    the remote job resolves it from the variable, forwarded with the secrets."""
    monkeypatch.setenv("MY_NOTE_VAR", "planted-note-7c1e")
    task = build_task(default_config(), ["+model.init_args.note=${oc.env:MY_NOTE_VAR}"], "summrl", resources=False)
    assert task.secrets["MY_NOTE_VAR"].get_secret_value() == "planted-note-7c1e"
    assert "${oc.env:MY_NOTE_VAR}" in task.run and "planted-note-7c1e" not in task.run + task.setup


def test_dry_run_prints_a_redacted_task_writes_no_secret_and_launches_nothing(cloud_env, tmp_path):
    import subprocess

    run_dir = tmp_path / "run"
    env = {**os.environ, "SKY_RUNTIME_DIR": str(SKY_RUNTIME), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "summrl.train", "backend.dry_run=true", "run.name=dry", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "summrl: dry run: the task is valid; nothing was launched" in result.stdout
    assert "GEMINI_API_KEY: <redacted>" in result.stdout and "backend=local_gpu" in result.stdout
    written = [p for root in (run_dir, cloud_env) for p in root.rglob("*") if p.is_file()]
    assert written, "the run folder holds the resolved config"
    for value in PLANTED.values():
        assert value not in result.stdout + result.stderr
        for path in written:
            if path.name != "config.toml":  # the RunPod credentials file the test wrote
                assert value.encode() not in path.read_bytes(), path


def test_dry_run_multirun_names_a_cluster_per_job(cloud_env, tmp_path):
    import subprocess

    env = {**os.environ, "SKY_RUNTIME_DIR": str(SKY_RUNTIME)}
    result = subprocess.run(
        [sys.executable, "-m", "summrl.train", "-m", "backend.dry_run=true", "run.name=sweep", "seed=1,2",
         f"hydra.sweep.dir={tmp_path / 'multirun'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for job, seed in ((0, 1), (1, 2)):
        assert f"summrl: dry run: cluster summrl-{job}, H100:1 on runpod" in result.stdout
        assert f"seed={seed} dataset.train_size=3500 dataset.val_size=91 run.name=sweep-{job} " in result.stdout


def test_cluster_is_reused_and_kept_with_autostop_down(cloud_env, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="summrl")
    fake = FakeSky(monkeypatch)
    for _ in range(2):
        run_on_cluster(launcher_config(), [], None)
    launches = [c for c in fake.calls if c[0] == "launch"]
    assert [c[2] for c in launches] == [{"cluster_name": "summrl", "idle_minutes_to_autostop": 10, "down": True}] * 2
    assert ("tail_logs", "summrl", 7, True) in fake.calls
    assert "down" not in fake.names()
    assert "python -m summrl.cluster down summrl" in said(caplog, logging.INFO)


def test_a_finished_job_returns_its_val_score_from_the_s3_backup(cloud_env, monkeypatch, s3_endpoint):
    """Sweepers get the remote run's score: the run backs up its result.json, the launcher reads it back."""
    fake = FakeSky(monkeypatch)
    result = {"status": "completed", "steps": 40, "final_val_score": 0.71}

    def remote_job(cluster, job_id, follow):  # what the job on the cluster leaves in the bucket
        fake.calls.append(("tail_logs", cluster, job_id, follow))
        s3(s3_endpoint).put_object(Bucket="results", Key="summrl/summrl/summary-rl/result.json",
                                   Body=json.dumps(result).encode())
        return 0

    monkeypatch.setattr(sky, "tail_logs", remote_job)
    config = default_config("storage.bucket=results", f"storage.endpoint_url={s3_endpoint}")
    config.run.dir = str(cloud_env.parent / "launcher-run")
    s3(s3_endpoint).create_bucket(Bucket="results")
    assert run_on_cluster(config, [], None) == 0.71
    assert json.loads((cloud_env.parent / "launcher-run" / "result.json").read_text()) == result


def test_down_after_run_takes_the_cluster_down_even_when_the_job_fails(cloud_env, monkeypatch):
    fake = FakeSky(monkeypatch, exit_code=100)
    with pytest.raises(RemoteJobFailed) as e:
        run_on_cluster(launcher_config("backend.down_after_run=true"), [], None)
    assert e.value.exit_code == 100 and e.value.cluster == "summrl"
    assert fake.names()[-2:] == ["down", "stream_and_get"] and ("down", "summrl") in fake.calls


def test_remote_exit_code_is_propagated(cloud_env, monkeypatch):
    FakeSky(monkeypatch, exit_code=103)
    with pytest.raises(RemoteJobFailed) as e:
        run_on_cluster(launcher_config(), [], None)
    assert e.value.exit_code == 103
    # A single run (python -m summrl.train) exits with it.
    with pytest.raises(SystemExit) as exit_:
        launch.run_from_hydra(launcher_config())
    assert exit_.value.code == 103


# python -m summrl.train with SkyPilot's network calls faked: a sweep's job 0 exits 100 (failed), job 1 0
FAILING_SWEEP = """
import runpy, sys
import sky
sky.launch = lambda task, **kw: ("launch", task.name)
sky.stream_and_get = lambda request: [7] if request[0] == "launch" else None
sky.tail_logs = lambda cluster, job_id, follow=True, **kw: 100 if cluster.endswith("-0") else 0
sky.down = lambda name: ("down", name)
sky.get = lambda request: None
sys.argv = ["summrl.train", *sys.argv[1:]]
runpy.run_module("summrl.train", run_name="__main__")
"""


def test_a_sweeps_failed_remote_job_is_recorded_and_the_sweep_goes_on(cloud_env, tmp_path):
    """RemoteJobFailed was no expected failure: the sweep ended at job 0 with a traceback, and the job's folder
    had no result.json (found by an audit)."""
    import subprocess

    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-c", FAILING_SWEEP, "-m", "seed=1,2", "storage.enabled=false",
                           f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SKY_RUNTIME_DIR": str(SKY_RUNTIME)})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    failed = json.loads((sweep / "0" / "result.json").read_text())
    assert (failed["status"], failed["error_kind"], failed["exit_code"]) == ("failed", "remote", 100)
    assert failed["error"].startswith("remote job failed: the job 7 on cluster summrl-0 ended with exit code 100")
    assert "on cluster summrl-1" in (sweep / "1" / "train.log").read_text()  # the sweep went on


def test_a_sweeps_job_with_a_bad_config_fails_on_its_own_and_the_others_go_on(cloud_env, tmp_path):
    """Pricing the sweep composes every job: each job failed with the bad job's config error, naming none (found by
    an audit). Now the bad job fails on its own, with its own line; the others say which job will fail, price it
    $0 and go on."""
    import subprocess

    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "summrl.train", "-m", "judge=lexical", "reward=ruler,qa",
                           "backend.dry_run=true", f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "SKY_RUNTIME_DIR": str(SKY_RUNTIME)})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    bad = json.loads((sweep / "0" / "result.json").read_text())
    assert bad["error_kind"] == "config" and bad["error"].startswith(
        "config error: a RULER reward (reward=ruler, or a ruler term or base of the reward) needs an LLM judge")
    log = (sweep / "1" / "train.log").read_text()
    assert re.search(r"warning: job 0 of the sweep \(judge=lexical reward=ruler backend.dry_run=True\) has a config "
                     r"error, so it will fail on its own and is priced \$0: a RULER reward .* needs an LLM judge", log), log
    assert "summrl: dry run: cluster summrl-1" in log  # it went on (a dry run writes no result.json)


def test_multirun_jobs_drive_their_own_clusters(cloud_env, monkeypatch):
    fake = FakeSky(monkeypatch)
    config = launcher_config()
    config.run.name = "sweep-1"  # as load_config names a multirun's job
    run_on_cluster(config, ["seed=2"], 1)
    assert fake.calls[0][2]["cluster_name"] == "summrl-1"
    assert "run.name=sweep-1" in fake.calls[0][1].run


def test_ctrl_c_cancels_the_job_and_says_how_to_take_the_cluster_down(cloud_env, monkeypatch, caplog):
    fake = FakeSky(monkeypatch, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        run_on_cluster(launcher_config("backend.down_after_run=true"), [], None)
    assert ("cancel", "summrl", [7]) in fake.calls and "down" not in fake.names()
    err = said(caplog, logging.ERROR)  # stderr under Hydra (summrl.logs)
    assert "cancelled job 7 on summrl" in err and "python -m summrl.cluster down summrl" in err


def test_ctrl_c_while_provisioning_cancels_the_launch(cloud_env, monkeypatch, caplog):
    fake = FakeSky(monkeypatch, interrupt_provisioning=True)
    with pytest.raises(KeyboardInterrupt):
        run_on_cluster(launcher_config(), [], None)
    assert ("api_cancel", "launch-request") in fake.calls and "tail_logs" not in fake.names()
    err = said(caplog, logging.ERROR)
    # SkyPilot sets autostop after provisioning: the cluster is not said to go down by itself (it said so)
    assert "before SkyPilot set its autostop" in err and "python -m summrl.cluster down summrl" in err
    assert "idle minutes pass" not in err


def test_preflight_lists_every_missing_item_before_provisioning(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in [*PLANTED, "AWS_SESSION_TOKEN"]:
        monkeypatch.delenv(name, raising=False)
    fake = FakeSky(monkeypatch)
    with pytest.raises(PreflightError) as e:
        run_on_cluster(default_config(), [], None)
    message = str(e.value)
    for item in (".runpod/config.toml does not exist", "runpod config", "sky check runpod", "GEMINI_API_KEY",
                 "BACKUP_BUCKET", "come back from the cluster only through them", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY"):
        assert item in message
    assert fake.calls == []
    # a bucket given as a URL: boto3 refused it only on the cluster, after its paid setup
    monkeypatch.setenv("BACKUP_BUCKET", "s3://planted-bucket")
    with pytest.raises(PreflightError, match=r"\$BACKUP_BUCKET is not a bucket name") as e:
        run_on_cluster(default_config(), [], None)
    assert "planted-bucket" not in str(e.value) and fake.calls == []


def test_wandb_mode_reaches_the_remote_job_and_only_an_online_run_needs_the_wandb_key(cloud_env, monkeypatch):
    def wants_key(*overrides) -> bool:
        return any("WANDB_API_KEY" in p for p in launch.preflight(launcher_config("logger=wandb", *overrides)))

    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert not wants_key()
    fake = FakeSky(monkeypatch)
    run_on_cluster(launcher_config("logger=wandb"), ["logger=wandb"], None)
    task = fake.calls[0][1]
    assert task.envs == {"WANDB_MODE": "offline"}  # a setting, not a secret: a plain env of the remote job
    assert "WANDB_API_KEY" not in task.secrets and "WANDB_MODE" not in task.secrets
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wants_key()
    monkeypatch.delenv("WANDB_MODE")
    assert not wants_key()  # logger.mode=auto with no key: offline
    assert wants_key("logger.mode=online") and not wants_key("logger.mode=offline")
    assert build_task(launcher_config("logger=wandb"), [], "summrl").envs == {}  # nothing to forward


def test_preflight_reads_runpod_key_from_its_config_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".runpod").mkdir()
    (tmp_path / ".runpod" / "config.toml").write_text("[default]\n")
    assert "no api_key" in launch.runpod_credentials_problem()
    (tmp_path / ".runpod" / "config.toml").write_text('[default]\napi_key = "k"\n')
    assert launch.runpod_credentials_problem() is None


def test_skyignore_keeps_keys_outputs_and_environments_off_the_cluster(tmp_path):
    shutil.copy(ROOT / ".skyignore", tmp_path / ".skyignore")
    for rel in (".env", "runs/r1/art/x.safetensors", "multirun/2026-01-01/0/result.json", ".venv/bin/python",
                "outputs/o.txt", "summrl/train.py", "conf/train.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    excluded = set(storage_utils.get_excluded_files(str(tmp_path)))
    assert {".env", "runs", ".venv", "outputs"} <= excluded
    assert any(p.startswith("multirun/") for p in excluded)
    assert not {"summrl/train.py", "conf/train.yaml", "summrl", "conf"} & excluded


def test_questions_written_here_are_asked_for_here_and_travel_with_the_cloud_job(cloud_env, tmp_path, monkeypatch,
                                                                                  capsys):
    """dataset=documents on a cloud GPU with a paid judge: the remote job has no terminal to confirm the writer's cost,
    so the launch refuses until `summrl.data prepare` has written the questions here (it asks here); then they are
    copied with the task into the remote job's question cache, and no cluster writes them again."""
    import subprocess

    from summrl.data.__main__ import main as data
    from summrl.testing import FakeLLM

    project = tmp_path / "project"  # a run folder under a git work tree that ignores runs/, as in this repo
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text("runs/\n")
    run_dir = project / "runs" / "summary-rl"
    with FakeLLM() as server:
        cloud = ["dataset=documents", f"dataset.path={ROOT / 'tests' / 'fixtures' / 'documents'}",
                 "judge=openai_compatible", "judge.model=gpt-4o-mini", f"judge.api_base={server.base_url}",
                 "judge.cache_dir=null", f"dataset.questions.cache_dir={tmp_path / 'questions'}"]
        config = default_config(*cloud, f"run.dir={run_dir}")  # the defaults: backend=skypilot
        (refused,) = [p for p in launch.preflight(config) if p.startswith("dataset.questions")]
        assert refused.startswith("dataset.questions: 10 documents have no questions yet, and the remote job has no "
                                  "terminal") and "python -m summrl.data prepare" in refused
        assert build_task(config, cloud, "summrl", resources=False).file_mounts is None
        assert not [p for p in launch.preflight(default_config(*cloud, "dataset.questions.confirm=false"))
                    if p.startswith("dataset.questions")]
        assert server.requests == []
        monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
        data(["prepare", *cloud])  # the same overrides, cloud defaults and all: asked for, and written, here
        assert "10 written now, 0 from the cache" in capsys.readouterr().out
    assert not [p for p in launch.preflight(config) if p.startswith("dataset.questions")]
    task = build_task(config, cloud, "summrl", resources=False)
    staged = run_dir / "questions"
    assert task.file_mounts == {"~/.cache/summrl/questions": str(staged)}
    cached = sorted((tmp_path / "questions").glob("*.json"))
    assert len(cached) == 10
    assert {p.name: p.read_bytes() for p in cached} == {p.name: p.read_bytes() for p in staged.glob("*.json")}
    assert storage_utils.get_excluded_files(str(staged)) == []  # SkyPilot uploads every one of them
    remote = compose_config(shlex.split(task.run.splitlines()[-1])[3:])  # as the cluster will compose it
    assert remote.dataset.questions.cache_dir == "~/.cache/summrl/questions"
    assert str(tmp_path / "questions") not in task.run


def test_rubrics_written_here_by_prepare_travel_with_the_cloud_job(cloud_env, tmp_path, monkeypatch, capsys):
    """reward=rubric with a paid judge: each cluster (each job of a sweep) would write, and pay for, every document's
    rubrics again. `summrl.data prepare` writes them here, after the estimate and a y/N; the launch then carries the
    judge's cached rubrics to the remote job's rubric cache."""
    from summrl.data.__main__ import main as data
    from summrl.testing import FakeLLM

    run_dir = tmp_path / "project" / "runs" / "summary-rl"
    rubrics = tmp_path / "rubrics"

    def rubric_writes(server):
        return [r for r in server.requests if '"positive_rubrics"' in r["messages"][-1]["content"]]

    with FakeLLM() as server:
        cloud = ["dataset=documents", f"dataset.path={ROOT / 'tests' / 'fixtures' / 'documents'}",
                 "judge=openai_compatible", "judge.model=gpt-4o-mini", f"judge.api_base={server.base_url}",
                 "judge.cache_dir=null", f"dataset.questions.cache_dir={tmp_path / 'questions'}", "reward=rubric",
                 f"reward.cache_dir={rubrics}"]
        config = default_config(*cloud, f"run.dir={run_dir}")
        assert build_task(config, cloud, "summrl", resources=False).file_mounts is None  # nothing cached yet
        data(["inspect", "experiment=local", *cloud])  # what prepare would write, calling nothing (a local policy's
        # tokenizer measures the documents: the cloud default's is not on this machine)
        assert ("summrl: rubrics (reward, max_rubrics=8): 10 documents to write rubrics for (0 cached in"
                in capsys.readouterr().out) and server.requests == []
        monkeypatch.setattr("sys.stdin", io.StringIO("y\nn\n"))  # the questions' cost, then the rubrics' declined
        with pytest.raises(SystemExit) as declined:
            data(["prepare", *cloud])
        assert declined.value.code == 3 and rubric_writes(server) == []
        out = capsys.readouterr().out
        assert "summrl: rubrics (reward, max_rubrics=8): 10 documents to write rubrics for (0 cached in" in out
        assert "judge gpt-4o-mini: 10 calls" in out
        monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # the questions are cached now: only the rubrics ask
        data(["prepare", *cloud])
        assert len(rubric_writes(server)) == 10
        assert "10 documents' rubrics written into" in capsys.readouterr().out
        monkeypatch.setattr("sys.stdin", io.StringIO(""))  # nothing left to write: nothing asked, nothing called
        data(["prepare", *cloud])
        assert "0 documents to write rubrics for (10 cached in" in capsys.readouterr().out
        assert len(rubric_writes(server)) == 10
    task = build_task(config, cloud, "summrl", resources=False)
    staged = run_dir / "rubrics"
    assert task.file_mounts["~/.cache/summrl/rubrics"] == str(staged)
    cached = sorted(rubrics.glob("*.json"))
    assert len(cached) == 10
    assert {p.name: p.read_bytes() for p in cached} == {p.name: p.read_bytes() for p in staged.glob("*.json")}
    remote = compose_config(shlex.split(task.run.splitlines()[-1])[3:])  # as the cluster will compose it
    assert remote.reward.cache_dir == "~/.cache/summrl/rubrics" and str(rubrics) not in task.run
    weighted = ["reward=qa_rubric", f"+reward.terms.rubric.cache_dir={rubrics}"]  # a rubric term, pinned alike
    command = build_task(default_config(*weighted), weighted, "summrl", resources=False).run.splitlines()[-1]
    assert compose_config(shlex.split(command)[3:]).reward.terms["rubric"].reward.cache_dir == "~/.cache/summrl/rubrics"
    # another judge keys its rubrics apart: none of these would be read, so none go
    other = default_config(*cloud, "judge.model=gpt-4o", f"run.dir={tmp_path / 'other'}")
    assert "~/.cache/summrl/rubrics" not in (build_task(other, cloud, "summrl", resources=False).file_mounts or {})


def test_a_launch_on_the_users_documents_reads_them_once(cloud_env, tmp_path, monkeypatch):
    """The preflight (questions still to write) and the task (the cached questions it carries) both need the
    documents; each reading goes through every file, so a launch reads them once and shares what it read."""
    from summrl import splits

    reads = []
    read = splits.read_documents
    monkeypatch.setattr(splits, "read_documents", lambda *a, **k: reads.append(1) or read(*a, **k))
    overrides = ["dataset=documents", f"dataset.path={ROOT / 'tests' / 'fixtures' / 'documents'}", "judge=lexical",
                 "backend.dry_run=true"]
    assert run_on_cluster(launcher_config(*overrides, f"run.dir={tmp_path / 'run'}"), overrides) is None
    assert len(reads) == 1


def test_cluster_command_takes_down_and_tails_the_named_cluster(monkeypatch, capsys, caplog):
    from summrl import cluster

    fake = FakeSky(monkeypatch, exit_code=100)
    assert cluster.main(["down", "summrl-1"]) == 0
    assert ("down", "summrl-1") in fake.calls and "cluster summrl-1 is down" in capsys.readouterr().out
    assert cluster.main(["logs"]) == 100  # the job's exit code, like `sky logs`
    assert ("tail_logs", "summrl", None, True) in fake.calls

    def no_such_cluster(name, *args, **kwargs):  # what SkyPilot 0.14 raises for a name it does not know
        raise sky.exceptions.ClusterDoesNotExist(f"\x1b[33mCluster {name!r} does not exist.\x1b[0m")

    monkeypatch.setattr(sky, "down", no_such_cluster)
    monkeypatch.setattr(sky, "tail_logs", no_such_cluster)
    for command in ("down", "logs"):
        assert cluster.main([command, "nope"]) == 2
        assert capsys.readouterr().err == ("summrl: there is no cluster nope (python -m summrl.cluster status lists "
                                           "the clusters)\n")

    def unreachable(*args, **kwargs):  # SkyPilot's API server down: a traceback, where summrl.sweep says one line
        raise sky.exceptions.ApiServerConnectionError("http://127.0.0.1:46580")

    for command, call in (("status", "status"), ("down", "down"), ("logs", "tail_logs")):
        monkeypatch.setattr(sky, call, unreachable)
        with pytest.raises(SystemExit) as stopped:
            cluster.main([command, "summrl"])
        assert stopped.value.code == 8  # SkyPilot's
        assert "summrl: SkyPilot error: " in capsys.readouterr().err + "".join(
            r.getMessage() for r in caplog.records)

    from sky.schemas.api.responses import StatusResponse
    from sky.utils.status_lib import ClusterStatus

    record = StatusResponse(name="summrl", launched_at=0, status=ClusterStatus.UP, autostop=10, to_down=True,
                            cluster_hash="h", cluster_ever_up=True, user_hash="u", user_name="me", workspace="default",
                            is_managed=False, nodes=1)
    monkeypatch.setattr(sky, "status", lambda cluster_names=None: ("status", cluster_names))
    monkeypatch.setattr(sky, "get", lambda request: [record] if request == ("status", None) else [])
    assert cluster.main(["status"]) == 0
    assert "summrl\tUP\t\tautostop 10 min (down)" in capsys.readouterr().out
    record.autostop, record.to_down = -1, False  # SkyPilot's none (it printed "autostop -1 min")
    assert cluster.main(["status"]) == 0
    assert "summrl\tUP\t\tno autostop" in capsys.readouterr().out
