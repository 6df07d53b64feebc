"""A real Hydra multirun: each job gets its own folder under the sweep dir and its own ART model name."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow

TINY = ["experiment=local", "trainer.max_steps=1", "trainer.eval_every=1", "trainer.max_summary_tokens=8",
        "dataset.val_size=1", "dataset.train_size=2"]


def test_sweep_jobs_do_not_collide(tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(["-m", *TINY, "run.name=sweep", "seed=1,2", f"hydra.sweep.dir={sweep}"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        outcome = json.loads((sweep / job / "result.json").read_text())
        assert outcome["status"] == "completed" and outcome["run_name"] == f"sweep-{job}"
        assert (sweep / job / "art" / "summrl" / "models" / f"sweep-{job}" / "checkpoints" / "0001").is_dir()
        assert f"seed={int(job) + 1}" in (sweep / job / ".hydra" / "overrides.yaml").read_text()
