"""``rows.csv``: one row per (model, step, document, rollout), appended and fsynced as each document's
rollouts are scored, so a crash loses only what was in flight. A rerun reads the keys already there
and skips them.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from summrl.errors import ConfigError
from summrl.job import append_jsonl, jsonl_rows


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
    hallucinated: int  # 1: the summary states a number, date or proper name absent from the document
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


def _header_cut_short(record: list[str]) -> bool:
    """Whether ``record`` is the start of the header, cut inside or after one of its names."""
    n = len(record)
    return 0 < n <= len(FIELDS) and record[:-1] == FIELDS[: n - 1] and FIELDS[n - 1].startswith(record[-1])


class RowStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.done: set[tuple[str, str, str, int]] = set()
        if self.path.exists():
            for record in self._complete_records():
                self.done.add(row_key(record["model"], None if record["step"] == "" else int(record["step"]),
                                      record["document_id"], int(record["rollout"])))

    def _complete_records(self) -> list[dict]:
        """The rows that were written whole. Rows are appended in order, so only the last one can be cut short
        by a crash (summaries hold newlines, so a line is not a row): it is dropped and redone on this run. Read as
        bytes: a cut inside a character (a summary's é) is replaced there, in the row that is dropped anyway."""
        data = self.path.read_bytes().decode("utf-8", errors="replace")
        records: list[list[str]] = []
        cut = False
        try:
            for record in csv.reader(io.StringIO(data, newline=""), strict=True):
                records.append(record)
        except csv.Error:  # a quoted summary cut before its closing quote: that record was not yielded
            cut = True
        if len(records) == 1 and records[0] != FIELDS and _header_cut_short(records[0]):
            records, cut = [FIELDS], True  # the first write, cut inside the header: no row was written
        if records and records[0] != FIELDS:
            raise ConfigError(f"{self.path}: not a rows file of this version (columns {records[0][:4]}...); "
                             "pick a new benchmark.name")
        body = records[1:]
        if body and not cut and (not data.endswith("\r\n") or len(body[-1]) != len(FIELDS)):
            body = body[:-1]  # cut inside an unquoted field, or before its line's end
        if cut or len(body) != len(records[1:]):
            self._rewrite(body)
        return [dict(zip(FIELDS, r)) for r in body]

    def _rewrite(self, body: list[list[str]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(FIELDS)
            writer.writerows(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, rows: list[Row]) -> None:
        """Write a document's rows in one write, then flush and fsync."""
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=FIELDS)
        if not self.path.exists() or self.path.stat().st_size == 0:
            writer.writeheader()
        for row in rows:
            record = asdict(row)
            record["step"] = "" if row.step is None else row.step
            for key in ("model_cost_usd", "judge_cost_usd"):
                record[key] = "" if math.isnan(record[key]) else record[key]
            writer.writerow(record)
        with open(self.path, "a", newline="") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        self.done.update(r.key() for r in rows)


def read_rows(path: Path) -> pd.DataFrame:
    """The rows as a frame; ``step`` is nullable (<NA> for models that are not checkpoints)."""
    frame = pd.read_csv(path, dtype={"document_id": str, "model": str, "summary": str}, keep_default_na=False,
                        na_values={"step": [""], "model_cost_usd": [""], "judge_cost_usd": [""]})
    frame["step"] = frame["step"].astype("Int64")
    return frame


class KeptSummaries:
    """Summaries paid for but not yet scored into rows.csv (``generated.jsonl``, appended and flushed as each comes
    back): a judge that fails, or a sibling rollout's model call that does, no longer throws them away, and the rerun
    scores them without calling the model again. Keyed as rows are (model label, step, document, rollout)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.kept: dict[tuple, dict] = {}
        for record in jsonl_rows(self.path.read_text(encoding="utf-8", errors="replace")) if self.path.exists() else []:
            self.kept[(*row_key(*record["key"]), record.get("candidate"))] = record

    def get(self, model: str, step: Optional[int], document_id: str, rollout: int,
            candidate: Optional[int] = None) -> Optional[dict]:
        """The rollout's summary; with ``candidate``, one of its best-of-N candidates."""
        return self.kept.get((*row_key(model, step, document_id, rollout), candidate))

    def add(self, model: str, step: Optional[int], document_id: str, rollout: int, summary: dict,
            candidate: Optional[int] = None) -> None:
        record = {"key": [model, step, document_id, rollout], **summary,
                  **({"candidate": candidate} if candidate is not None else {})}
        append_jsonl(self.path, [record])
        self.kept[(*row_key(model, step, document_id, rollout), candidate)] = record
