"""Trustworthy comparisons: a seeded val pass scores the same weights the same way in every arm and every run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow


def val_history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "result.json").read_text())["val_history"]


def val_summaries(run_dir: Path, step: int) -> list[str]:
    """The val pass's summaries as ART logged them (sorted: requests finish in any order)."""
    (path,) = run_dir.glob(f"art/*/models/*/trajectories/val/{step:04d}.parquet")
    return sorted(messages[-1]["content"] for messages in pd.read_parquet(path).messages)


def test_arms_share_step0_val_per_doc_and_a_repeated_run_gives_the_same_val(shared_sweep, tmp_path):
    """conftest.shared_sweep's two arms (grpo, dr_grpo), then a single run repeating the grpo arm."""
    from tests.conftest import SWEEP_ARGS

    jobs = shared_sweep.jobs()
    grpo, dr_grpo = jobs[("grpo", 2)], jobs[("dr_grpo", 2)]
    summaries = val_summaries(grpo, 0)
    assert len(set(summaries)) == 8  # 2 documents x 4 sampled summaries, all different ...
    assert val_summaries(dr_grpo, 0) == summaries  # ... and the same in the other arm
    first, other = val_history(grpo), val_history(dr_grpo)
    step0, step0_other = first[0]["per_doc"], other[0]["per_doc"]
    assert first[0]["step"] == other[0]["step"] == 0 and len(step0) == 2
    # the same documents, the same summaries, the same scores, document by document
    assert step0 == step0_other
    assert all(s["qa_accuracy"] is not None for s in step0.values())

    again = tmp_path / "again"
    repeat = run_cli([*[a for a in SWEEP_ARGS if a != "logger=wandb"], shared_sweep.weights, "algorithm=grpo",
                      "dataset.train_size=2",
                      f"hydra.run.dir={again}"], cwd=ROOT)
    assert repeat.returncode == 0, repeat.stderr[-3000:]
    assert val_history(again) == first  # every val pass, per document: train rollouts are seeded per step too
    assert val_summaries(again, 0) == summaries and val_summaries(again, 1) == val_summaries(grpo, 1)
    history = [json.loads(line) for line in next(again.glob("art/*/models/*/history.jsonl")).read_text().splitlines()]
    val_rows = [r for r in history if any(k.startswith("val/doc/") for k in r)]
    doc = next(iter(step0))
    assert val_rows[0][f"val/doc/{doc}/qa_accuracy"] == step0[doc]["qa_accuracy"]
