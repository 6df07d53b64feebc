"""What a judge wrote once (rubrics, questions), kept on disk so that reruns and every job of a sweep pay once.

One JSON file per key; the key is a list of plain values (the document's text hash, the writer: model, endpoint and
prompt version, and the settings). Writes are atomic (a temp file per writer, then a rename), so parallel sweep jobs
writing one document never clash; a file that can't be read is a miss, and is written again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from summrl.data.document import unix_newlines


def document_hash(text: str) -> str:
    """The document's part of a key, its line endings as LF: a copy re-saved with Windows' line endings is one
    document to the reader, and its questions were paid for again."""
    return hashlib.sha256(unix_newlines(text).encode()).hexdigest()


def document_hashes(text: str) -> list[str]:
    """``document_hash``, then the text's own hash where it differs: what keyed a CRLF document's entries before
    2026-12-07 (read, so that they are not paid for again; never written)."""
    return list(dict.fromkeys([document_hash(text), hashlib.sha256(text.encode()).hexdigest()]))


class JsonCache:
    def __init__(self, directory: str) -> None:
        self.directory = Path(directory).expanduser()

    def path(self, *key: Any) -> Path:
        return self.directory / f"{hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()}.json"

    def document_path(self, text: str, *rest: Any, new: bool = False) -> Path:
        """The entry of a document's text (and ``rest`` of the key): to read, the one on disk under
        ``document_hashes``' first key that has one; ``new``, or none on disk: where an entry is written."""
        paths = [self.path(digest, *rest) for digest in document_hashes(text)]
        return paths[0] if new else next((p for p in paths if p.exists()), paths[0])

    def read(self, path: Path) -> Optional[dict]:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):  # absent, or cut short by a crash: written again
            return None
        return saved if isinstance(saved, dict) else None

    def write(self, path: Path, value: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f)
                f.flush()
                os.fsync(f.fileno())  # a paid reply: on disk before the rename makes it the cache's
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
