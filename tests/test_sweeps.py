"""Real multiruns in subprocesses, tiny scale: job folders, result.json, failure isolation, W&B offline
runs (read back from their .wandb records), the report, the joblib launcher and the optuna sweeper."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli, wandb_records

pytestmark = pytest.mark.slow

TINY = ["experiment=local", "trainer.max_steps=1", "trainer.eval_every=1", "trainer.max_summary_tokens=8",
        "dataset.val_size=1"]
PLANTED = {"GEMINI_API_KEY": "planted-gemini-7c1d2f", "AWS_SECRET_ACCESS_KEY": "planted-aws-9e8f7a"}


def test_wandb_sweep_isolates_a_failing_job_and_reports(tmp_path):
    sweep = tmp_path / "multirun" / "2026-11-22" / "05-10-00"
    # job 1 asks for more train documents than the sample has: it fails after its W&B run started
    result = run_cli(["-m", *TINY, "logger=wandb", "dataset.train_size=2,999", "run.name=wb",
                      f"hydra.sweep.dir={sweep}"], cwd=ROOT, env={**PLANTED, "WANDB_API_KEY": ""})
    assert result.returncode != 0  # the sweep reports its failed job...
    ok, failed = (json.loads((sweep / j / "result.json").read_text()) for j in ("0", "1"))
    assert ok["status"] == "completed" and ok["steps"] == 1 and ok["run_name"] == "wb-0"  # ...after running the rest
    assert ok["overrides"] == [*TINY, "logger=wandb", "dataset.train_size=2", "run.name=wb"]
    assert ok["final_val_qa_accuracy"] is not None and ok["judge_cost_usd"] == 0.0 and ok["wall_s"] > 0
    assert failed["status"] == "failed" and "train_size" in failed["error"]

    good, bad = wandb_records(sweep / "0"), wandb_records(sweep / "1")
    assert good["project"] == "summrl" and good["group"] == "2026-11-22_05-10-00" == bad["group"]
    assert good["name"] == "dataset.train_size=2,dataset.val_size=1,trainer.eval_every=1,trainer.max_steps=1," \
                           "trainer.max_summary_tokens=8"
    assert set(good["tags"]) == {"reward=qa", "judge=local", "model=smollm2_135m", "backend=embedded",
                                "algorithm=grpo", "sft=none"}
    config = good["config"]
    assert config["reward"] == "qa" and config["judge"] == "local" and config["model.lr"] == 5e-4
    assert config["trainer.max_steps"] == 1 and config["seed"] == 80
    steps = [row for row in good["history"] if "training_step" in row]
    assert {row["training_step"] for row in steps} == {0, 1}
    assert any("val/reward" in row and "val/qa_accuracy" in row for row in steps)
    assert any("train/loss/train" in row or "train/reward" in row for row in steps)
    assert any(key.startswith("val/samples") for row in good["history"] for key in row)
    assert not any(key.startswith("val/doc/") for row in good["history"] for key in row)  # kept out of W&B panels
    assert good["exit_code"] == 0 and bad["exit_code"] == 1

    for path in sweep.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in PLANTED.values():
                assert secret.encode() not in data, f"{secret} leaked into {path}"

    report = run_cli_report(sweep, tmp_path / "report")
    assert "2 jobs: 1 completed, 1 failed." in report
    import matplotlib.image as mpimg

    for name in ("val_curves.png", "best_val.png"):
        image = mpimg.imread(tmp_path / "report" / name)
        assert image.shape[1] > 400 and image[..., :3].std() > 0.05


def run_cli_report(folder: Path, out: Path) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "summrl.report", str(folder), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return (out / "report.md").read_text()


def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(["-m", *TINY, "dataset.train_size=2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                      "run.name=par", "seed=1,2", f"hydra.sweep.dir={sweep}"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Joblib.Parallel" in result.stderr + result.stdout  # the joblib launcher, not the basic one
    for job in ("0", "1"):
        outcome = json.loads((sweep / job / "result.json").read_text())
        assert outcome["status"] == "completed" and outcome["run_name"] == f"par-{job}"
        assert outcome["seed"] == int(job) + 1
        assert (sweep / job / "art" / "summrl" / "models" / f"par-{job}" / "checkpoints" / "0001").is_dir()


def test_optuna_sweeper_searches_the_learning_rate(tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(["-m", *TINY, "dataset.train_size=2", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                      "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=1",
                      "model.lr=interval(0.0001,0.001)", f"hydra.sweep.dir={sweep}"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert 1e-4 <= best["best_params"]["model.lr"] <= 1e-3
    scores = [json.loads((sweep / j / "result.json").read_text())["final_val_score"] for j in ("0", "1")]
    assert best["best_value"] == pytest.approx(max(scores))  # the task's return value is what optuna maximizes
