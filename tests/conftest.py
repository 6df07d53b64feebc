"""Shared helpers: compose the real config tree, and write a Repliqa fixture in the exact schema."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hydra.core.hydra_config import HydraConfig

from summrl.config import Config, compose, validate

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
SAMPLE = ROOT / "summrl" / "data" / "repliqa_sample.jsonl"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# One de-quantized copy of the GGUF model for every run of the session, subprocesses included, also those that
# point HOME elsewhere (W&B tests): the first load writes it, every later one reads it in about a second.
os.environ.setdefault("SUMMRL_CACHE_DIR", str(Path.home() / ".cache" / "summrl"))
# Every test its own home (the fixture below): by default the judge's replies, the written questions and the rubrics
# are cached under ~, keyed by the endpoint, and a fake judge's loopback port is new each time. Shared, a test whose
# fake judge got a port that an earlier test (or an earlier suite run on this machine) had used read that test's
# cached replies: its scripted 500 was never served, and it trained for 230 s. Matplotlib's font cache and Hugging
# Face's stay where they were: each new home would rebuild them.
for _name, _path in (("MPLCONFIGDIR", ".config/matplotlib"), ("HF_HOME", ".cache/huggingface")):
    os.environ.setdefault(_name, str(Path.home() / _path))
# pytest-xdist: each worker's torch (and each subprocess it starts) gets its share of the cores. Two workers of two
# threads each on 2 cores put 4 OpenMP threads on 2 cores, and every small op then waits for a descheduled one.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)


@pytest.fixture(autouse=True)
def own_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


def compose_raw(overrides: list[str]):
    cfg = compose("train", ["run.dir=/tmp/summrl-test-run", *overrides], return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    HydraConfig.instance().set_config(cfg)
    return cfg, choices


def compose_config(overrides: list[str]) -> Config:
    cfg, choices = compose_raw(overrides)
    return validate(cfg)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def repliqa_rows(n_docs: int, questions_per_doc: int = 5) -> list[dict]:
    rows = []
    for d in range(n_docs):
        doc_id = f"doc{d:05d}"
        text = f"Document {d}. The Harbor Festival in Townsville{d} drew {100 + d} visitors on June {1 + d % 28}, 2024."
        for q in range(questions_per_doc):
            unanswerable = q == questions_per_doc - 1
            rows.append({
                "document_id": doc_id,
                "document_topic": "Local News",
                "document_path": f"pdfs/repliqa_0/{doc_id}.pdf",
                "document_extracted": text,
                "question_id": f"{doc_id}-q{q + 1}",
                "question": f"Question {q + 1} about document {d}?",
                "answer": "UNANSWERABLE" if unanswerable else f"{100 + d} visitors",
                "long_answer": "NA" if unanswerable else text,
            })
    return rows


@pytest.fixture
def repliqa_parquet(tmp_path):
    """Write a parquet file in Repliqa's exact schema; returns a function (n_docs, rows=None) -> path."""
    import pandas as pd

    def write(n_docs: int = 20, rows: list[dict] | None = None, name: str = "repliqa_0.parquet") -> Path:
        path = tmp_path / name
        pd.DataFrame(rows if rows is not None else repliqa_rows(n_docs)).to_parquet(path)
        return path

    return write


def run_cli(args: list[str], cwd: Path, timeout: float = 900, env: dict | None = None):
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "summrl.train", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


HEAVY = ("torch", "art", "litellm", "transformers")


def heavy_imports(stderr: str) -> list[str]:
    """Which of torch, ART, litellm and transformers a process run with ``PYTHONPROFILEIMPORTTIME=1`` imported
    (its stderr): a config error must come before them, as it does in well under 2 s (a figure a loaded machine
    can't hold a test to)."""
    imported = {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in imported]


# ---------------------------------------------------------------- a real S3 endpoint on loopback (moto's server)

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)


def s3(endpoint):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")


def keys(endpoint, bucket, prefix=""):
    listing = s3(endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


# ---------------------------------------------------------------- W&B offline runs, read back with wandb's own reader


def wandb_records(run_dir: Path) -> dict:
    """The offline run under ``run_dir/wandb``: run header (project, group, name, tags, config), history rows,
    exit code, and whether it was marked preempting."""
    import json

    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = run_dir.glob("wandb/offline-run-*/*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    out: dict = {"history": [], "exit_code": None, "config": {}}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out.update(project=run.project, group=run.run_group, name=run.display_name, tags=list(run.tags),
                       job_type=run.job_type, config={u.key: json.loads(u.value_json) for u in run.config.update})
        elif kind == "config":  # set after the start (a resumed run's, once past its checks)
            out["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
        elif kind == "preempting":
            out["preempting"] = True
    return out


# ---------------------------------------------------------------- a tiny model for plumbing


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> str:
    """``model.weights=<folder>``: SmolLM2-135M's tokenizer and config with 2 of its 30 layers, randomly initialised
    (seeded). For runs whose text does not matter (storage, resume, sweeps, records, failures): a run takes about half
    the time. Its summaries are random tokens, always max_summary_tokens long. Tests where the text, a judge's
    reply or learning matters keep SmolLM2 itself."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from summrl.backends.embedded.engine import load_causal_lm

    config = compose_config(["experiment=local"])
    tokenizer, model = load_causal_lm(config.model.base_model, config.model.weights, torch.float32,
                                      torch.device("cpu"))
    shape = AutoConfig.for_model(**{**model.config.to_dict(), "num_hidden_layers": 2})
    del model
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-model")
    AutoModelForCausalLM.from_config(shape).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return f"model.weights={folder}"


def said(caplog, level: int) -> str:
    """What summrl logged at exactly ``level``: under Hydra, INFO and WARNING lines go to stdout, ERROR to stderr
    (summrl.logs). The subprocess tests read the real console."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("summrl") and r.levelno == level)

# ---------------------------------------------------------------- train once, assert many times
#
# One small offline run (tiny model) through the real entry point (a subprocess), shared by the end-to-end tests of training,
# resume, S3 backup and restore, the LLM judge's key handling, the run record and history. Two invocations:
# steps 1-2, then, with the run folder deleted as on a fresh machine, step 3 resumed from the S3 backup.
# reward=ruler on the loopback judge: a real LLM-judge client with a planted key, whose RULER scores (by
# length) differ within a group, so the update has a signal; val also grades QA through the same judge.

SHARED_SECRET = "sk-planted-judge-5f0e2d"
SHARED_ARGS = ["experiment=local", "reward=ruler", "judge=openai_compatible", "judge.model=openai/gpt-4o-mini",
               "judge.api_key_env=FAKE_JUDGE_KEY", "trainer.eval_every=1", "trainer.max_summary_tokens=16",
               "trainer.groups_per_step=2", "trainer.rollouts_per_group=3", "trainer.val_rollouts_per_doc=2",
               "dataset.val_size=2", "dataset.train_size=4", "storage.enabled=true", "storage.bucket=shared",
               "run.name=shared"]


@dataclass
class SharedRun:
    run_dir: Path
    endpoint: str  # the S3 endpoint it backed up to (bucket "shared")
    judge: Any  # the loopback judge (FakeLLM): requests and headers it saw
    first: Any  # CompletedProcess of steps 1-2
    second: Any  # CompletedProcess of step 3, resumed from S3 into an empty run folder
    after_first: dict  # what the first invocation left: checkpoints, result, history rows, step-2 LoRA weights

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "art" / "summrl" / "models" / "shared"

    def history(self) -> list[dict]:
        return [json.loads(line) for line in (self.model_dir / "history.jsonl").read_text().splitlines()]

    def result(self) -> dict:
        return json.loads((self.run_dir / "result.json").read_text())


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory, s3_endpoint, tiny_weights) -> SharedRun:
    from safetensors.torch import load_file

    from summrl.testing import FakeLLM

    root = tmp_path_factory.mktemp("shared")
    run_dir = root / "run"
    env = {**CREDENTIALS, "FAKE_JUDGE_KEY": SHARED_SECRET, "LITELLM_LOG": "DEBUG"}
    with FakeLLM() as judge:
        args = [*SHARED_ARGS, tiny_weights, f"judge.api_base={judge.base_url}", f"judge.cache_dir={root / 'judge-cache'}",
                f"storage.endpoint_url={s3_endpoint}", f"hydra.run.dir={run_dir}"]
        first = run_cli([*args, "trainer.max_steps=2"], cwd=ROOT, env=env)
        assert first.returncode == 0, first.stderr[-3000:]
        model_dir = run_dir / "art" / "summrl" / "models" / "shared"
        after_first = {
            "checkpoints": sorted(p.name for p in (model_dir / "checkpoints").iterdir()),
            "result": json.loads((run_dir / "result.json").read_text()),
            "history": [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()],
            "lora_step2": load_file(model_dir / "checkpoints" / "0002" / "adapter_model.safetensors"),
            "files": {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*")
                      if p.is_file() and p.stat().st_size < 50_000_000},
        }
        shutil.rmtree(run_dir)  # a fresh machine: only the S3 backup is left
        second = run_cli([*args, "trainer.max_steps=3"], cwd=ROOT, env=env)
        assert second.returncode == 0, second.stderr[-3000:]
    return SharedRun(run_dir, s3_endpoint, judge, first, second, after_first)


# One multirun of four jobs through the real entry point, shared by the sweep, comparison and algorithm tests:
# on the tiny model, two arms (algorithm=grpo,dr_grpo) that train a step each, and, for each, a job that fails (more train documents
# than the sample has) after its W&B run started. W&B offline, with planted keys that must leak nowhere.
SWEEP_PLANTED = {"GEMINI_API_KEY": "planted-gemini-7c1d2f", "AWS_SECRET_ACCESS_KEY": "planted-aws-9e8f7a"}
SWEEP_ARGS = ["experiment=local", "trainer.max_steps=1", "trainer.eval_every=1", "trainer.max_summary_tokens=8",
              "dataset.val_size=2", "trainer.val_rollouts_per_doc=4", "trainer.groups_per_step=1",
              "trainer.rollouts_per_group=2", "seed=5", "logger=wandb", "run.name=wb"]
SWEEP_ARMS = ["algorithm=grpo,dr_grpo", "dataset.train_size=2,999"]


@dataclass
class SharedSweep:
    folder: Path  # hydra.sweep.dir, named like Hydra's default (<date>/<time>)
    process: Any  # CompletedProcess of the multirun
    weights: str  # the tiny_weights override its jobs ran with

    def jobs(self) -> dict[tuple[str, int], Path]:
        """(algorithm, train_size) -> the job's folder."""
        out = {}
        for job in sorted(p for p in self.folder.iterdir() if p.is_dir() and p.name.isdigit()):
            overrides = json.loads((job / "result.json").read_text())["overrides"]
            algo = next(o.split("=")[1] for o in overrides if o.startswith("algorithm="))
            size = next(int(o.split("=")[1]) for o in overrides if o.startswith("dataset.train_size="))
            out[(algo, size)] = job
        return out


@pytest.fixture(scope="session")
def shared_sweep(tmp_path_factory, tiny_weights) -> SharedSweep:
    folder = tmp_path_factory.mktemp("sweep") / "multirun" / "2026-11-22" / "05-10-00"
    process = run_cli(["-m", *SWEEP_ARGS, tiny_weights, *SWEEP_ARMS, f"hydra.sweep.dir={folder}"], cwd=ROOT,
                      env={**SWEEP_PLANTED, "WANDB_API_KEY": ""})
    assert process.returncode != 0, "two of the four jobs fail"
    assert len(list(folder.glob("[0-9]/result.json"))) == 4, process.stderr[-3000:]
    return SharedSweep(folder, process, tiny_weights)
