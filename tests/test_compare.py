"""Trustworthy comparisons: a seeded val pass scores the same weights the same way in every arm and every run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow
SMALL = ["experiment=local", "trainer.max_steps=1", "trainer.max_summary_tokens=8", "dataset.val_size=2",
         "dataset.train_size=2", "trainer.groups_per_step=1", "trainer.rollouts_per_group=2", "seed=5"]


def val_history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "result.json").read_text())["val_history"]


def val_summaries(run_dir: Path, step: int) -> list[str]:
    """The val pass's summaries as ART logged them (sorted: requests finish in any order)."""
    (path,) = run_dir.glob(f"art/*/models/*/trajectories/val/{step:04d}.parquet")
    return sorted(messages[-1]["content"] for messages in pd.read_parquet(path).messages)


def test_arms_share_step0_val_per_doc_and_a_repeated_run_gives_the_same_val(tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(["-m", *SMALL, "reward=qa,length_penalized", f"hydra.sweep.dir={sweep}"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = val_summaries(sweep / "0", 0)
    assert len(set(summaries)) == 8  # 2 documents x 4 sampled summaries, all different ...
    assert val_summaries(sweep / "1", 0) == summaries  # ... and the same in the other arm
    qa, penalized = val_history(sweep / "0"), val_history(sweep / "1")
    step0_qa, step0_penalized = qa[0]["per_doc"], penalized[0]["per_doc"]
    assert qa[0]["step"] == penalized[0]["step"] == 0 and len(step0_qa) == 2
    # the same documents, the same summaries, the same QA accuracy, document by document
    assert {d: s["qa_accuracy"] for d, s in step0_qa.items()} == {d: s["qa_accuracy"] for d, s in step0_penalized.items()}
    assert all(s["qa_accuracy"] is not None for s in step0_qa.values())

    again = tmp_path / "again"
    repeat = run_cli([*SMALL, "reward=qa", f"run.dir={again}"], cwd=ROOT)
    assert repeat.returncode == 0, repeat.stderr[-3000:]
    assert val_history(again) == qa  # every val pass, per document: train rollouts are seeded per step too
    assert val_summaries(again, 0) == summaries and val_summaries(again, 1) == val_summaries(sweep / "0", 1)
    history = [json.loads(line) for line in next(again.glob("art/*/models/*/history.jsonl")).read_text().splitlines()]
    val_rows = [r for r in history if any(k.startswith("val/doc/") for k in r)]
    doc = next(iter(step0_qa))
    assert val_rows[0][f"val/doc/{doc}/qa_accuracy"] == step0_qa[doc]["qa_accuracy"]
