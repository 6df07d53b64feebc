"""Shared helpers: compose the real config tree, and write a Repliqa fixture in the exact schema."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from summrl.config import Config, validate

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
SAMPLE = ROOT / "summrl" / "data" / "repliqa_sample.jsonl"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def compose_raw(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["run.dir=/tmp/summrl-test-run", *overrides], return_hydra_config=True)
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
