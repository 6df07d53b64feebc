"""``rows.csv``: one row per (model, step, document, rollout), appended and fsynced as each document's
rollouts are scored, so a crash loses only what was in flight. A rerun reads the keys already there
and skips them.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd


@dataclass
class Row:
    model: str  # the entry's label, or the trained run's name
    step: Optional[int]  # checkpoint step (0 = base model); empty for other models
    document_id: str
    rollout: int
    score: float  # fraction of the document's questions the judge answered correctly from the summary
    reward: float  # the configured training reward
    correct: str  # per-question correctness, JSON: [1, 0, 1, 1, 1] in the document's question order
    questions: int
    words: int
    chars: int
    model_calls: int
    model_cost_usd: float  # empty: the price is unknown
    judge_calls: float  # the document's judge calls, shared evenly by its rollouts
    judge_cost_usd: float  # empty: unknown
    ranking_calls: int  # best-of-N: RULER calls
    summary: str

    def key(self) -> tuple[str, str, str, int]:
        return row_key(self.model, self.step, self.document_id, self.rollout)


FIELDS = list(Row.__dataclass_fields__)


def row_key(model: str, step: Optional[int], document_id: str, rollout: int) -> tuple[str, str, str, int]:
    return (model, "" if step is None else str(int(step)), str(document_id), int(rollout))


def correctness(verdicts: list[bool]) -> str:
    return json.dumps([int(v) for v in verdicts])


class RowStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.done: set[tuple[str, str, str, int]] = set()
        if self.path.exists():
            self._drop_partial_line()
            for record in self._records():
                self.done.add(row_key(record["model"], None if record["step"] == "" else int(record["step"]),
                                      record["document_id"], int(record["rollout"])))

    def _drop_partial_line(self) -> None:
        """A crash mid-write can leave a last line without its newline: cut it, it is redone on this run."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def _records(self) -> Iterable[dict]:
        with open(self.path, newline="") as f:
            for record in csv.DictReader(f):
                if None not in record.values() and None not in record:
                    yield record

    def append(self, rows: list[Row]) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            for row in rows:
                record = asdict(row)
                record["step"] = "" if row.step is None else row.step
                for key in ("model_cost_usd", "judge_cost_usd"):
                    record[key] = "" if math.isnan(record[key]) else record[key]
                writer.writerow(record)
            f.flush()
            os.fsync(f.fileno())
        self.done.update(r.key() for r in rows)


def read_rows(path: Path) -> pd.DataFrame:
    """The rows as a frame; ``step`` is nullable (<NA> for models that are not checkpoints)."""
    frame = pd.read_csv(path, dtype={"document_id": str, "model": str, "summary": str}, keep_default_na=False,
                        na_values={"step": [""], "model_cost_usd": [""], "judge_cost_usd": [""]})
    frame["step"] = frame["step"].astype("Int64")
    return frame
