"""Repliqa: one row per question, grouped here into documents with their questions.

Rows come from the hub (``datasets.load_dataset("ServiceNow/repliqa", split="repliqa_0")``) or from
local parquet/jsonl files in the same schema. The split follows Summary-RL: shuffle the documents
with a seeded ``random.Random``, val is the first ``val_size``, train the next ``train_size``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

from summrl.data.document import UNANSWERABLE, Document, Question, resolve_path, rubric_list
from summrl.data.documents import Row, cell_text, frame_rows, not_text, read_jsonl
from summrl.data.split import DataError, split
from summrl.errors import NETWORK_FIX, NetworkError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from summrl.config import RepliqaDatasetConfig

REPLIQA_COLUMNS = (
    "document_id",
    "document_topic",
    "document_path",
    "document_extracted",
    "question_id",
    "question",
    "answer",
    "long_answer",
)
RUBRIC_COLUMNS = ("positive_rubrics", "negative_rubrics")  # optional: per-document rubrics (lists of strings)
def _read_rows(path: Path) -> list[dict]:
    """The rows of one file, each a :class:`~summrl.data.documents.Row` that knows its place (a .jsonl file's line,
    a parquet or .json table's row counted from 1) for the errors of :func:`group_documents`."""
    if not path.exists():
        raise DataError(f"{path}: no such file (dataset.files lists it)")
    suffix = path.suffix.lower()  # data.JSONL, as dataset=documents reads it
    if suffix not in (".parquet", ".jsonl", ".json"):
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .parquet or .jsonl")
    if suffix == ".jsonl":  # line by line, as dataset=documents reads it: a bad line is named by its number
        rows = read_jsonl(path)
        columns = list(dict.fromkeys(k for row in rows for k in row))
    else:
        import pandas as pd

        try:
            frame = (pd.read_parquet(path) if suffix == ".parquet"
                     else pd.read_json(path, dtype=False, encoding="utf-8"))
        except Exception as e:  # pandas' and pyarrow's many parse errors (not UTF-8, a damaged file)
            raise DataError(f"{path}: can't be read as {path.suffix} ({type(e).__name__}: {str(e)[:200]}): check "
                            "the file, or fetch it again") from None
        rows, columns = frame_rows(frame.to_dict("records"), path), [str(c) for c in frame.columns]
    if not rows:
        raise DataError(f"{path}: no rows; Repliqa's schema is a row per question ({', '.join(REPLIQA_COLUMNS)})")
    missing = [c for c in REPLIQA_COLUMNS if c not in columns]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)}; Repliqa's schema is {', '.join(REPLIQA_COLUMNS)}"
        )
    kept = [*REPLIQA_COLUMNS, *(c for c in RUBRIC_COLUMNS if c in columns)]
    return [Row({c: row.get(c) for c in kept}, row.file, row.at) for row in rows]


def _place(row: Mapping, index: int, source: str) -> Row:
    """Where a row is: its own place when read from a file, else ``row <n>`` (from 1) of ``source`` (the hub)."""
    return row if isinstance(row, Row) else Row({}, source, f"row {index + 1}")


def group_documents(rows: Iterable[Mapping], source: str) -> list[Document]:
    """Group question rows by document_id, keeping first-seen order. Bad rows raise DataError."""
    texts: dict[str, tuple[str, str]] = {}
    rubrics: dict[str, dict[str, tuple[tuple[str, ...], Row]]] = {}  # document -> column -> (rubrics, first row)
    questions: dict[str, list[Question]] = {}
    first_row: dict[str, Row] = {}
    question_rows: dict[str, Row] = {}
    differing: set[str] = set()
    for index, row in enumerate(rows):
        place = _place(row, index, source)
        where = place.where
        doc_id = cell_text(row.get("document_id"))  # a .json table's null is NaN: no id, not "nan"
        if not doc_id:
            raise DataError(f"{where}: empty document_id")
        where = f"{where} (document {doc_id})"
        text = row.get("document_extracted")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: " + (not_text(text, "document_extracted") or
                                             "empty document_extracted: give the row its document text or remove it"))
        question = row.get("question")
        answer = row.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: " + (not_text(question, "question") or "empty question"))
        if not isinstance(answer, str) or not answer.strip():
            raise DataError(f"{where}: " + (not_text(answer, "answer") or
                                             f"empty answer (use {UNANSWERABLE!r} for unanswerable)"))
        if doc_id not in texts:
            texts[doc_id] = (cell_text(row.get("document_topic")), text)
            questions[doc_id] = []
            rubrics[doc_id] = {}
            first_row[doc_id] = place
        elif text != texts[doc_id][1] and doc_id not in differing:
            differing.add(doc_id)  # its questions are asked of the first row's text
            log.warning(f"summrl: {where}: document_extracted differs from "
                        f"{place.named_from(first_row[doc_id])}'s for the same document; the first is used")
        question_id = cell_text(row.get("question_id"))
        if question_id:
            seen = question_rows.setdefault(str(question_id), place)
            if seen is not place:  # e.g. one file listed twice in dataset.files: every question counted twice
                raise DataError(f"{where}: question_id {question_id} is also {place.named_from(seen)}'s; list "
                                "each file once in dataset.files, or give each question its own id")
        for column in RUBRIC_COLUMNS:  # a document's rows that give its rubrics must agree; the others leave them out
            value = rubric_list(row.get(column), column, where)
            if value is None:
                continue
            given = rubrics[doc_id].setdefault(column, (value, place))
            if given[0] != value:
                raise DataError(f"{where}: {column} differs from {place.named_from(given[1])}'s for the same "
                                "document; give a document's rubrics once, or the same on each of its rows")
        questions[doc_id].append(
            Question(
                id=question_id or f"{doc_id}-q{len(questions[doc_id]) + 1}",
                question=question.strip(),
                answer=answer.strip(),
                long_answer=cell_text(row.get("long_answer")),
            )
        )
    return [Document(id=i, topic=t, text=x, questions=tuple(questions[i]),
                     **{column: value for column, (value, _) in rubrics[i].items()}) for i, (t, x) in texts.items()]


def _load_rows(files: list[str] | None, hf_path: str, hf_split: str) -> tuple[list[dict], str]:
    if files:
        rows: list[dict] = []
        for spec in files:
            path = resolve_path(spec)
            rows.extend(_read_rows(path))
        return rows, ", ".join(files)
    from datasets import load_dataset

    try:
        dataset = load_dataset(hf_path, split=hf_split)
    except Exception as e:  # the hub is unreachable or the split is wrong
        if unreachable := hub_unreachable():  # (datasets' retries drop the connection error: "not cached in None")
            raise NetworkError(f"could not load {hf_path} split {hf_split}: {unreachable}, or download it once and set "
                               "dataset.files=[path/to/repliqa_0.parquet]") from e
        raise DataError(
            f"could not load {hf_path} split {hf_split} from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Behind a firewall, download it once and set dataset.files=[path/to/repliqa_0.parquet]."
        ) from e
    missing = [c for c in REPLIQA_COLUMNS if c not in dataset.column_names]
    if missing:
        raise DataError(f"{hf_path}/{hf_split}: missing column(s) {', '.join(missing)}")
    return list(dataset), f"{hf_path}/{hf_split}"


def hub_unreachable() -> str:
    """Why the Hugging Face hub can't be reached from here, with the fix ("" when it can be, as far as a name lookup
    tells)."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    host = urlsplit(constants.ENDPOINT).hostname or "huggingface.co"
    if constants.HF_HUB_OFFLINE:
        return f"HF_HUB_OFFLINE is set, so {host} is not asked: unset it"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as e:
        return f"can't reach {host} ({e.strerror or e}): {NETWORK_FIX}"
    return ""


def all_documents(dataset: "RepliqaDatasetConfig") -> list[Document]:
    """Every document of the dataset, in its files' order (``benchmark.split=all``: no split sizes)."""
    rows, source = _load_rows(dataset.files, dataset.hf_path, dataset.hf_split)
    return group_documents(rows, source)


def load_splits(dataset: "RepliqaDatasetConfig") -> tuple[list[Document], list[Document]]:
    """Return (val, train) documents for ``cfg.dataset``."""
    rows, source = _load_rows(dataset.files, dataset.hf_path, dataset.hf_split)
    return split(group_documents(rows, source), dataset, source)
