"""Online learning's inbox: the documents ``summrl.serve`` summarized (``serve.record=true``), and which of them a run
has trained on (``dataset=inbox``).

``<run_dir>/inbox/documents.jsonl`` gets one JSON line per summarized document: its id, text, time and the step that
served it (never a request's headers or keys), appended and flushed to disk (``job.append_jsonl``): a crash
mid-write loses at most that line, which stays a line of its own that the reader skips, and the lines recorded after
it are kept.

``<run_dir>/inbox/watermark.json`` maps a checkpoint step to how many inbox lines the run had consumed when it reached
that step. An online step writes its entry *before* it trains: a crash before its checkpoint is saved resumes at the
previous step, whose entry still holds; a crash after resumes at this step, whose entry is already there. So nothing
is trained twice and nothing is skipped. Each entry also keeps a hash of the last line it consumed, and the watermark
the val size: an inbox replaced or cut (archived, restored from an older copy) no longer has those lines where the
watermark counts them, and is refused rather than having the documents recorded since skipped. The first
``dataset.val_size`` documents ever recorded are the run's val set for online learning (fixed as the inbox grows, and
its size kept: a larger one would take documents already trained on into val) and are never trained on; the
watermark keeps their lines from the first online step on, so a val line emptied later does not pull the next document
recorded, one already trained on, into val.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

from summrl.data.split import DataError
from summrl.job import append_jsonl, write_json

INBOX = "inbox"
DOCUMENTS = "documents.jsonl"
WATERMARK = "watermark.json"
TRAIN_LOCK = ".inbox-training.lock"  # in the run folder: the inbox folder's absence says nothing was recorded


def inbox_dir(run_dir: Any) -> Path:
    return Path(run_dir) / INBOX


def hold_training(run_dir: Any) -> IO:
    """The run's lock for one dataset=inbox run at a time, held until the returned file closes (or the process ends):
    two at once (a scheduled run overlapping the last) would both read the same watermark and train the same
    documents twice."""
    from summrl.errors import ConfigError

    path = Path(run_dir) / TRAIN_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    held = path.open("a")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.close()
        raise ConfigError(f"dataset=inbox: another process is training this run on its inbox ({path} is locked): "
                          "two would train the same documents; run again once it has ended") from None
    return held


class Recorder:
    """Appends served documents to a run's inbox."""

    def __init__(self, run_dir: Any) -> None:
        """Raises ConfigError for an inbox folder that can't be made (a file there, a read-only run folder): said at
        startup, not as a traceback."""
        from summrl.errors import ConfigError

        self.path = inbox_dir(run_dir) / DOCUMENTS
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"serve.record=true: can't create the run's inbox {self.path.parent} "
                              f"({e.strerror or e}): make that path a writable folder, or leave serve.record off"
                              ) from None

    def record(self, document_id: str, text: str, step: int) -> None:
        # a line a crash cut short stays a line of its own, which read() skips; the documents after it are kept
        append_jsonl(self.path, [{"id": document_id, "text": text, "time": time.time(), "step": step}])


@dataclass
class InboxRead:
    rows: list[dict]  # in recording order; each has its line number as "line"
    cut_short: int  # lines a crash cut short, or the last one still being written (no newline yet): skipped


def read(run_dir: Any) -> InboxRead:
    path = inbox_dir(run_dir) / DOCUMENTS
    if not path.exists():
        return InboxRead([], 0)
    rows, cut = [], 0
    lines = path.read_bytes().split(b"\n")
    # a last line without its newline is still being written, or was cut by a crash, even where it parses: skipped,
    # so the watermark never ends on it (it hashes whole lines only: the next run was refused); read once it ends
    unfinished = lines.pop()
    if unfinished.strip():
        cut += 1
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError:  # a write a crash cut short (at the end, or followed by the lines recorded after it)
            cut += 1
            continue
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
            raise DataError(f"{path}, line {number + 1}: not an inbox record (id, text, time, step): "
                            "empty the line but keep it (the watermark counts lines)")
        rows.append({**row, "line": number})
    return InboxRead(rows, cut)


def _watermark(run_dir: Any) -> dict:
    """The watermark file's fields: ``consumed`` (step -> lines), ``last_line`` (step -> the hash of the last line
    consumed), ``val_size``, ``val_lines`` (:func:`val_lines`); empty before the first online step. An unreadable
    watermark stops the run: read as empty, it would train every recorded document again."""
    path = inbox_dir(run_dir) / WATERMARK
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {"consumed": {}, "last_line": {}, "val_size": None, "val_lines": None}
    try:
        saved = json.loads(raw)
        val_lines = saved.get("val_lines")  # none before 2026-12-07
        return {"consumed": {int(k): int(v) for k, v in saved["consumed"].items()},
                "last_line": {int(k): str(v) for k, v in saved.get("last_line", {}).items()},  # none before 2026-11-28
                "val_size": None if saved.get("val_size") is None else int(saved["val_size"]),
                "val_lines": None if val_lines is None else [int(line) for line in val_lines]}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(
            f"{path} is unreadable ({type(e).__name__}): it records which inbox documents this run has trained on. "
            "Restore it from a backup, or delete it to train on the whole inbox again, documents already trained on "
            "included"
        ) from None


def watermark(run_dir: Any) -> dict[int, int]:
    """Each checkpoint step's consumed inbox lines; empty before the first online step."""
    return _watermark(run_dir)["consumed"]


def val_lines(run_dir: Any) -> Optional[list[int]]:
    """The inbox lines of the online val set, as its first online step found them (None before it): a val line
    emptied since (a secret scrubbed, as the refusal of a bad line advises) leaves val a document short, where the next
    document recorded, one already trained on, took its place."""
    return _watermark(run_dir)["val_lines"]


def forget_after(run_dir: Any, step: int) -> None:
    """Drop the entries past ``step``, the checkpoint a run resumes from: an online step that failed before its
    checkpoint left one, and a run that then trained that step on other data (another dataset, allowed while the
    failed run recorded nothing) made it count, skipping the documents it names at the next dataset=inbox run."""
    try:
        saved = _watermark(run_dir)
    except DataError:  # the next dataset=inbox run refuses it, naming the fix; a run on other data goes on
        return
    if any(s > step for s in saved["consumed"]):
        _write(run_dir, {s: c for s, c in saved["consumed"].items() if s <= step},
               {s: h for s, h in saved["last_line"].items() if s <= step}, saved["val_size"], saved["val_lines"])


def consumed_at(run_dir: Any, step: int) -> int:
    """Inbox lines consumed when the run reached ``step`` (0 before any online step)."""
    marks = watermark(run_dir)
    earlier = [s for s in marks if s <= step]
    return marks[max(earlier)] if earlier else 0


def _line_hash(run_dir: Any, number: int) -> Optional[str]:
    """The hash of the inbox's line ``number`` (0-based), None if the file has no such line."""
    path = inbox_dir(run_dir) / DOCUMENTS
    lines = path.read_bytes().split(b"\n") if path.exists() else []
    return hashlib.sha256(lines[number]).hexdigest()[:16] if number < len(lines) - 1 else None  # a whole line


def mark(run_dir: Any, step: int, consumed: int, val_size: Optional[int] = None,
         val: Optional[list[int]] = None) -> None:
    """Record (atomically) that reaching ``step`` consumes the inbox up to line ``consumed``; later entries, from a
    crashed attempt, are dropped. ``val``: the val set's lines, kept from the first mark that gives them."""
    saved = _watermark(run_dir)
    marks = {s: c for s, c in saved["consumed"].items() if s < step}
    hashes = {s: h for s, h in saved["last_line"].items() if s < step}
    marks[step], hashes[step] = consumed, _line_hash(run_dir, consumed - 1)
    _write(run_dir, marks, hashes, val_size if val_size is not None else saved["val_size"],
           saved["val_lines"] if saved["val_lines"] is not None else val)


def _write(run_dir: Any, marks: dict[int, int], hashes: dict[int, str], val_size: Optional[int],
           val: Optional[list[int]]) -> None:
    write_json(inbox_dir(run_dir) / WATERMARK, {
        "consumed": {str(s): c for s, c in sorted(marks.items())},
        "last_line": {str(s): h for s, h in sorted(hashes.items()) if h is not None},
        "val_size": val_size, **({"val_lines": sorted(val)} if val is not None else {})})


def check_watermark(run_dir: Any, step: int, val_size: int) -> None:
    """Refuse an inbox that no longer holds, where the watermark counts them, the lines the run trained on by
    ``step``, and a val size other than the one the run's online learning began with."""
    saved = _watermark(run_dir)
    path, documents = inbox_dir(run_dir) / WATERMARK, inbox_dir(run_dir) / DOCUMENTS
    if saved["val_size"] is not None and saved["val_size"] != val_size:
        raise DataError(f"dataset.val_size={val_size}: this run's online val set is the first {saved['val_size']} "
                        f"recorded documents ({path}); another size would move documents it trained on into val, or "
                        f"val documents into training: set dataset.val_size={saved['val_size']}")
    earlier = [s for s in saved["consumed"] if s <= step]
    if not earlier:
        return
    at = max(earlier)
    consumed = saved["consumed"][at]
    found = _line_hash(run_dir, consumed - 1)
    if found is None or (at in saved["last_line"] and found != saved["last_line"][at]):
        raise DataError(
            f"{documents}: line {consumed} is not the last line this run had trained on by step {at} ({path}): the "
            "inbox was replaced, cut or edited since, and the documents recorded after it would be skipped. Put the "
            "original file back (new documents appended after its lines), or, if the file holds only documents "
            f"recorded since, delete {path}: the run then trains on all of them, its first dataset.val_size as val")


@dataclass
class Batch:
    step: int  # the step this batch trains (0-based, like ART's iterate_dataset)
    items: list[Any]
    consumed: int  # inbox lines consumed once this batch is trained


@dataclass
class Online:
    """dataset=inbox: the new documents (each with its inbox line), trained once each, in order, from ``step`` on."""

    run_dir: Path
    new: list[tuple[Any, int]]  # (document, its line)
    start: int  # lines consumed at the step the run resumes from
    val_size: int  # dataset.val_size, kept in the watermark
    val_lines: Optional[list[int]] = None  # the val documents' lines, kept in the watermark by the first online step

    def batches(self, step: int, size: int) -> list[Batch]:
        """``size`` documents a step, except that the parts of a split document (one inbox line) train in one step:
        the watermark counts whole lines, so a part left to the next step was skipped after a crash between them."""
        out, k = [], 0
        while k < len(self.new):
            end = min(k + size, len(self.new))
            while end < len(self.new) and self.new[end][1] == self.new[end - 1][1]:
                end += 1
            chunk = self.new[k:end]
            out.append(Batch(step + len(out), [d for d, _ in chunk], chunk[-1][1] + 1))
            k = end
        return out

    def before_step(self, batch: Batch) -> None:
        mark(self.run_dir, batch.step + 1, batch.consumed, self.val_size, self.val_lines)


def online(run_dir: Any, step: int, documents: list[Any], lines: dict[str, int], val_ids: set[str], val_size: int,
           limit: Optional[int] = None) -> Online:
    """The documents recorded after what ``step`` consumed, val documents left out. Raises DataError for an inbox
    or a val size the watermark does not match (:func:`check_watermark`)."""
    check_watermark(run_dir, step, val_size)
    start = consumed_at(run_dir, step)
    new = sorted(((d, lines[d.id]) for d in documents if d.id not in val_ids and lines[d.id] >= start),
                 key=lambda pair: pair[1])
    return Online(Path(run_dir), new[:limit] if limit else new, start, val_size,
                  sorted({lines[i] for i in val_ids if i in lines}))
