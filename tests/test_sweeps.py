"""Real multiruns in subprocesses, tiny scale: job folders, result.json, failure isolation, W&B offline
runs (read back from their .wandb records), the report, the joblib launcher and the optuna sweeper."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT, run_cli, wandb_records

pytestmark = pytest.mark.slow

TINY = ["experiment=local", "trainer.max_steps=1", "trainer.eval_every=1", "trainer.max_summary_tokens=8",
        "dataset.val_size=1"]


def test_wandb_sweep_isolates_a_failing_job_and_reports(shared_sweep, tmp_path):
    """conftest.shared_sweep: algorithm=grpo,dr_grpo x dataset.train_size=2,999; the 999 jobs fail after their W&B
    run started."""
    from tests.conftest import SWEEP_ARGS, SWEEP_PLANTED

    # the sweep reports its failed jobs (cli.run: a sweep's JobFailed ends it with 1, not a traceback)...
    assert shared_sweep.process.returncode == 1 and "Traceback" not in shared_sweep.process.stderr
    jobs = shared_sweep.jobs()
    ok, failed = (json.loads((jobs[("grpo", size)] / "result.json").read_text()) for size in (2, 999))
    assert ok["status"] == "completed" and ok["steps"] == 1  # ...after running the rest
    assert ok["run_name"] == f"wb-{jobs[('grpo', 2)].name}"
    assert ok["overrides"] == [*SWEEP_ARGS, shared_sweep.weights, "algorithm=grpo", "dataset.train_size=2"]
    assert ok["final_val_qa_accuracy"] is not None and ok["judge_cost_usd"] == 0.0 and ok["wall_s"] > 0
    assert failed["status"] == "failed" and "train_size" in failed["error"]
    # The tiny model's random-token summaries answer no question: the step's two summaries scored alike, nothing was
    # trained (ART's count of trainable groups is 0), and the run says so in result.json, its log and the report.
    history = [json.loads(line) for line in (jobs[("grpo", 2)] / "art" / "summrl" / "models" / ok["run_name"] /
                                             "history.jsonl").read_text().splitlines()]
    assert [r["data/step_num_groups_trainable"] for r in history if "train/reward" in r] == [0.0]
    assert ok["untrained_steps"] == [1]
    printed = (jobs[("grpo", 2)] / "train.log").read_text()
    assert "| nothing trained: every group scored its summaries alike" in printed
    assert "summrl: step 1 trained nothing (the LoRA is as it was before; result.json untrained_steps)" in printed

    good, bad = wandb_records(jobs[("grpo", 2)]), wandb_records(jobs[("grpo", 999)])
    assert good["project"] == "summrl" and good["group"] == "2026-11-22_05-10-00" == bad["group"]
    # the overrides that define the configuration, sorted: without seed, run name, logger and experiment
    assert good["name"] == ",".join(sorted([
        "algorithm=grpo", "dataset.train_size=2", "dataset.val_size=2", shared_sweep.weights, "trainer.eval_every=1",
        "trainer.groups_per_step=1", "trainer.max_steps=1", "trainer.max_summary_tokens=8",
        "trainer.rollouts_per_group=2", "trainer.val_rollouts_per_doc=4"]))
    assert set(good["tags"]) == {"reward=qa", "judge=local", "model=smollm2_135m", "backend=embedded",
                                "algorithm=grpo", "sft=none"}
    config = good["config"]
    assert config["reward"] == "qa" and config["judge"] == "local" and config["model.lr"] == 5e-4
    assert config["trainer.max_steps"] == 1 and config["seed"] == 5
    # result.json keeps every resolved setting too, as W&B has it: an experiment preset's values are not lost
    assert ok["config"]["trainer.rollouts_per_group"] == 2 and ok["config"]["dataset.val_size"] == 2
    assert all(config[key] == value for key, value in ok["config"].items() if not isinstance(value, list))
    steps = [row for row in good["history"] if "training_step" in row]
    assert {row["training_step"] for row in steps} == {0, 1}
    assert any("val/reward" in row and "val/qa_accuracy" in row for row in steps)
    assert any("train/loss/train" in row or "train/reward" in row for row in steps)
    assert any(key.startswith("val/samples") for row in good["history"] for key in row)
    assert not any(key.startswith("val/doc/") for row in good["history"] for key in row)  # kept out of W&B panels
    assert good["exit_code"] == 0 and bad["exit_code"] == 1

    for path in shared_sweep.folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in SWEEP_PLANTED.values():
                assert secret.encode() not in data, f"{secret} leaked into {path}"

    report = run_cli_report(shared_sweep.folder, tmp_path / "report")
    assert "4 jobs: 2 completed, 2 failed." in report
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert summary[summary.status == "completed"].steps_untrained.tolist() == [1, 1]
    import matplotlib.image as mpimg

    for name in ("val_curves.png", "final_val.png"):
        image = mpimg.imread(tmp_path / "report" / name)
        assert image.shape[1] > 400 and image[..., :3].std() > 0.05


def run_cli_report(folder: Path, out: Path) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "summrl.report", str(folder), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return (out / "report.md").read_text()


def test_optuna_searches_the_learning_rate_with_trials_in_parallel_joblib_processes(tmp_path, tiny_weights):
    """hydra/sweeper=optuna over model.lr, its trials launched by hydra/launcher=joblib, two at a time."""
    sweep = tmp_path / "multirun"
    result = run_cli(["-m", *TINY, tiny_weights, "dataset.train_size=2", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                      "hydra.sweeper.n_jobs=2", "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=1",
                      "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "run.name=par",
                      "model.lr=interval(0.0001,0.001)", f"hydra.sweep.dir={sweep}"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Joblib.Parallel" in result.stderr + result.stdout  # the joblib launcher, not the basic one
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert 1e-4 <= best["best_params"]["model.lr"] <= 1e-3
    outcomes = [json.loads((sweep / j / "result.json").read_text()) for j in ("0", "1")]
    assert [o["run_name"] for o in outcomes] == ["par-0", "par-1"] and all(o["status"] == "completed" for o in outcomes)
    for job in ("0", "1"):
        assert (sweep / job / "art" / "summrl" / "models" / f"par-{job}" / "checkpoints" / "0001").is_dir()
    # the task's return value is what optuna maximizes
    assert best["best_value"] == pytest.approx(max(o["final_val_score"] for o in outcomes))
    lrs = [float(next(o for o in outcome["overrides"] if o.startswith("model.lr="))[len("model.lr="):])
           for outcome in outcomes]  # each trial's sampled value reached its job
    assert len(set(lrs)) == 2 and all(1e-4 <= lr <= 1e-3 for lr in lrs)

    # The same sweep resumed in its folder with another sampler seed draws other learning rates: job N resumed trial
    # N's run (model.lr may change on a single run's resume), trained nothing, and gave Optuna its old score as the new
    # trial's, so the "best" learning rate was one never trained. Refused, before anything loads.
    command = [a.replace("sampler.seed=1", "sampler.seed=2") for a in result.args[3:]]
    again = run_cli(command, cwd=ROOT, timeout=300)
    assert again.returncode != 0
    assert "job 0 of this sweep resumes the run in" in again.stderr and "OptunaSweeper draws its values anew" in again.stderr
    assert [json.loads((sweep / j / "result.json").read_text()) for j in ("0", "1")] == outcomes  # records kept


def test_a_sweep_resumed_with_its_values_moved_is_refused_before_anything_loads(tmp_path):
    """The basic sweeper resumed in its folder with an edited list: job 0 is now model.lr=0.0001 and its folder holds
    the run trained with 0.0002. It took that run as its own and reported its score for the other value."""
    sweep = tmp_path / "multirun"
    for num, lr in enumerate(("0.0002", "0.0001")):  # the two jobs' records, as a stopped sweep left them
        (sweep / str(num)).mkdir(parents=True)
        (sweep / str(num) / "result.json").write_text(json.dumps({
            "run_name": f"abl-{num}", "status": "interrupted", "attempts": [{"started": "2026-12-07T10:00:00"}],
            "overrides": ["experiment=local", "run.name=abl", f"model.lr={lr}"]}))
    result = run_cli(["-m", "experiment=local", "run.name=abl", "model.lr=0.0001,0.0002", f"hydra.sweep.dir={sweep}"],
                     cwd=ROOT, timeout=120)
    assert result.returncode == 1
    assert (f"job 0 of this sweep resumes the run in {sweep}/0, trained with model.lr=0.0002 (now model.lr=0.0001): "
            "the sweep's values changed, so its jobs moved") in result.stderr
    assert f"job 1 of this sweep resumes the run in {sweep}/1, trained with model.lr=0.0001" in result.stderr
    assert not (sweep / "0" / "art").exists() and not (sweep / "1" / "art").exists()  # nothing loaded or trained
    # the list cut to one value: this sweep varies nothing, but the sweep that trained job 0 varied model.lr (its
    # record says so): job 0 went on training the 0.0002 run at 0.0001 and was labelled 0.0001 (a sweeps audit)
    shutil.rmtree(sweep / "1")
    record = json.loads((sweep / "0" / "result.json").read_text())
    (sweep / "0" / "result.json").write_text(json.dumps({**record, "sweep_varied": ["model.lr"]}))
    result = run_cli(["-m", "experiment=local", "run.name=abl", "model.lr=0.0001", "trainer.max_steps=2",
                      f"hydra.sweep.dir={sweep}"], cwd=ROOT, timeout=120)
    assert result.returncode == 1
    assert (f"job 0 of this sweep resumes the run in {sweep}/0, trained with model.lr=0.0002 (now model.lr=0.0001): "
            "the sweep's values changed, so its jobs moved") in result.stderr
    assert not (sweep / "0" / "art").exists()
