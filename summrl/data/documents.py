"""``dataset=documents``: the user's own documents, from a folder of files or one table with a row per document.

A folder: each ``.txt``/``.md`` file is a document, ``.html``/``.htm`` files are read with BeautifulSoup and ``.pdf``
files with pypdf; the id is the file's path relative to the folder. Other files are skipped and listed. A table
(``.jsonl``, ``.parquet``, ``.csv``): the columns are named in config (``dataset.text_field``, ``id_field``,
``questions_field`` and the rubric fields); without an id column a document's id is its text's hash.

Bad input stops here, before any model loads, with one line naming the file or row and the fix: an empty, binary
or non-UTF-8 file, a folder with nothing readable, a row without text, a questions cell of the wrong shape.
Duplicate documents (same text) are kept once and reported. Documents longer than ``dataset.max_document_tokens``
(the policy's tokens) are split at paragraph boundaries, skipped or refused (:func:`limit_length`), never cut.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from summrl.data.document import UNANSWERABLE, Document, Question, rubric_list, unix_newlines
from summrl.data.split import DataError
from summrl.data.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from summrl.config import DocumentsDatasetConfig

TEXT_SUFFIXES = (".txt", ".md", ".markdown")
HTML_SUFFIXES = (".html", ".htm")
PDF_SUFFIXES = (".pdf",)
READABLE = TEXT_SUFFIXES + HTML_SUFFIXES + PDF_SUFFIXES
TABLE_SUFFIXES = (".jsonl", ".parquet", ".csv")
QUESTIONS_SHAPE = ('a list of {"question": "...", "answer": "..."} objects (answer "UNANSWERABLE" for a question '
                   "the document does not answer)")


@dataclass
class Loaded:
    """The documents read from ``dataset.path``, and what happened on the way (printed and recorded)."""

    source: str
    documents: list[Document]
    skipped_files: list[tuple[str, str]] = field(default_factory=list)  # (file, why)
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (left-out id, the kept id with the same text)
    columns: dict[str, str] = field(default_factory=dict)  # what each configured column turned out to be
    long: dict[str, Any] = field(default_factory=dict)  # limit_length's counts
    # the ids as read, before limit_length skipped or split any: the val/train split is drawn from these, so that
    # another limit moves no other document between val and train (splits.split_whole)
    read_ids: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"source": self.source, "documents": len(self.documents),
                "with_questions": sum(bool(d.questions) for d in self.documents),
                "skipped_files": [{"file": f, "why": why} for f, why in self.skipped_files],
                "duplicates": [{"id": a, "same_text_as": b} for a, b in self.duplicates],
                "columns": self.columns, "long_documents": self.long}

    def lines(self) -> list[str]:
        """What the user must know about the read: skipped files, duplicates, long documents (nothing silent)."""
        out = [f"summrl: dataset: {len(self.documents)} documents from {self.source}"
               + (f" ({', '.join(f'{k}: {v}' for k, v in self.columns.items())})" if self.columns else "")]
        if self.skipped_files:
            out.append(f"summrl: dataset: skipped {len(self.skipped_files)} file(s): "
                       + "; ".join(f"{f} ({why})" for f, why in self.skipped_files[:10])
                       + (f"; and {len(self.skipped_files) - 10} more" if len(self.skipped_files) > 10 else ""))
        if self.duplicates:
            out.append(f"summrl: dataset: {len(self.duplicates)} duplicate document(s) kept once: "
                       + "; ".join(f"{a} = {b}" for a, b in self.duplicates[:10])
                       + (" ..." if len(self.duplicates) > 10 else ""))
        if self.long.get("over_limit"):
            how = {"split": f"split into {self.long['parts']} parts", "skip": "skipped"}[self.long["mode"]]
            out.append(f"summrl: dataset: {self.long['over_limit']} document(s) over dataset.max_document_tokens="
                       f"{self.long['limit']} {how} (dataset.long_documents={self.long['mode']})")
        return out


def text_hash(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


def same_text(text: str) -> str:
    """Duplicates' key: texts that differ only in line endings (a copy saved on Windows) or in the white space around
    them are one document (kept apart, the copies went one to val and one to train). The text itself is kept as read:
    its questions are cached under the hash of the same key (summrl.judges.cache.document_hash)."""
    return text_hash(unix_newlines(text))


# --------------------------------------------------------------------------- reading


def read(dataset: "DocumentsDatasetConfig") -> Loaded:
    """Every document at ``dataset.path`` (a folder or a table), duplicates kept once. Raises DataError."""
    path = Path(dataset.path).expanduser()
    if path.is_dir():
        loaded = _read_folder(path)
    elif path.is_file():
        if path.suffix.lower() not in TABLE_SUFFIXES:
            raise DataError(f"dataset.path={dataset.path}: a {path.suffix or 'suffix-less'} file is not a table: "
                            f"give a folder of documents, or a {', '.join(TABLE_SUFFIXES)} file with a row per document")
        loaded = _read_table(path, dataset)
    else:
        raise DataError(f"dataset.path={dataset.path}: no such file or folder (give a folder of documents, or a "
                        f"{', '.join(TABLE_SUFFIXES)} file)")
    kept: dict[str, str] = {}  # text hash -> id
    documents = []
    for document in loaded.documents:
        digest = same_text(document.text)
        if digest in kept:
            loaded.duplicates.append((document.id, kept[digest]))
            continue
        kept[digest] = document.id
        documents.append(document)
    loaded.documents = documents
    return loaded


def _folder_files(folder: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every file under ``folder`` (broken links included, to be listed), linked folders followed, as a user who
    linked one in expects (Path.rglob left them out unlisted); a real folder is read once, so a link loop ends."""
    files, skipped, seen = [], [], {os.path.realpath(folder)}
    # the folders reached without a link: each is read under its own path, and a link to one is the one left out
    # (in sorted order the first path owned it, so a link added beside a folder renamed its documents)
    real = set()
    for root, folders, _ in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]  # not read: a link to one is
        real.add(os.path.realpath(root))

    def unreadable(error: OSError) -> None:  # os.walk passed over a folder it can't list: its documents left unsaid
        where = Path(error.filename or folder)
        relative = where.relative_to(folder).as_posix() if where != folder and folder in where.parents else str(where)
        raise DataError(f"{relative}: can't be read ({error.strerror or error}): fix its permissions, or move it out of "
                        f"dataset.path={folder}")

    for root, folders, names in os.walk(folder, onerror=unreadable, followlinks=True):
        folders.sort()  # one order on every machine: the first path to a folder names its documents
        for name in list(folders):
            if name.startswith("."):  # not walked (its files would be skipped as hidden): nor taken as read, so a
                folders.remove(name)  # hidden link to a folder (.latest -> archive/2024) no longer hides the folder
                skipped.append(((Path(root) / name).relative_to(folder).as_posix(), "hidden"))
                continue
            path = os.path.join(root, name)
            target = os.path.realpath(path)
            if target in seen or (os.path.islink(path) and target in real):
                folders.remove(name)
                skipped.append(((Path(root) / name).relative_to(folder).as_posix(), "a link to a folder read already"))
                continue
            seen.add(target)
        files += [Path(root) / name for name in names]
    return sorted(files), skipped


def _shown(relative: str) -> str:
    """A path as it can be printed: a name that is not UTF-8 (its bytes, which Python keeps as surrogates) with those
    bytes escaped (\\xe9). Printed as it was, it ended the run with a UnicodeEncodeError."""
    return relative.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _read_folder(folder: Path) -> Loaded:
    documents = []
    files, skipped = _folder_files(folder)
    skipped = [(_shown(name), why) for name, why in skipped]
    for path in files:
        relative = _shown(path.relative_to(folder).as_posix())
        if not path.exists():  # a link to nothing: listed, as every file left out is
            skipped.append((relative, "a broken link"))
            continue
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            skipped.append((relative, "hidden"))
            continue
        if not path.is_file():  # a named pipe blocked the read for ever; a socket or device is no document either
            skipped.append((relative, "not a regular file"))
            continue
        if path.suffix.lower() not in READABLE:
            skipped.append((relative, f"not {'/'.join(s.lstrip('.') for s in READABLE)}"))
            continue
        if relative != path.relative_to(folder).as_posix():  # its id: read, then training's seeds failed to hash it
            raise DataError(f"{relative}: its name is not UTF-8 (the \\x bytes): rename it, e.g. convmv -f latin1 -t "
                            f"utf-8 --notest, or move it out of dataset.path={folder}")
        documents.append(Document(id=relative, topic=path.parent.relative_to(folder).as_posix().strip("."),
                                  text=_file_text(path, relative), questions=()))
    if not documents:
        listed = f" (found: {', '.join(f for f, _ in skipped[:5])})" if skipped else " (it is empty)"
        raise DataError(f"dataset.path={folder}: no readable document in this folder{listed}; put the documents in as "
                        f"{', '.join(READABLE)} files, or point dataset.path at a .jsonl/.parquet/.csv table")
    return Loaded(str(folder), documents, skipped)


def _not_utf16(data: bytes, where: str) -> None:
    """UTF-16 (Notepad's "Unicode", PowerShell 5's ``>``) and UTF-32 are named as such: they were called a binary file
    (UTF-16 with no byte-order mark, and UTF-32 was called UTF-16), or Latin-1."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        said, source = "UTF-32 text (its first bytes say so)", "utf-32"
    elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
        said, source = "UTF-16 text (its first bytes say so)", "utf-16"
    else:
        head = data[:256]
        head = head[:len(head) // 2 * 2]
        low, high = head[0::2], head[1::2]  # text in the Latin range: one of each pair of bytes is always 0
        if len(head) < 4 or not (high.count(0) == len(high) and 0 not in low
                                 or low.count(0) == len(low) and 0 not in high):
            return
        endian = "le" if high.count(0) == len(high) else "be"
        said, source = "UTF-16 text (every other byte is 0; no byte-order mark)", f"utf-16{endian}"
    raise DataError(f"{where}: {said}, not UTF-8: re-save it as UTF-8, e.g. iconv -f {source} -t utf-8")


def _utf8(data: bytes, where: str, also: str = "", by_line: bool = False) -> str:
    """``data`` as UTF-8 text (a BOM taken off), or a DataError naming the byte (and its line, for a table)."""
    _not_utf16(data, where)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        if by_line:
            line = data[: e.start].count(b"\n") + 1
            where = f"{where}, line {line}"
        raise DataError(f"{where}: not UTF-8 (byte {data[e.start]:#04x} at offset {e.start}): re-save it as "
                        f"UTF-8, e.g. iconv -f latin1 -t utf-8{also}") from None


def read_bytes(path: Path, where: str) -> bytes:
    """The file's bytes, or a DataError naming it (a file the run's user may not read was a traceback)."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"{where}: can't be read ({e.strerror or e}): fix its permissions, or remove it") from None


def _file_text(path: Path, relative: str) -> str:
    data = read_bytes(path, relative)
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        text = _pdf_text(path, relative)
    else:
        _not_utf16(data, relative)
        if b"\x00" in data:
            raise DataError(f"{relative}: a binary file, not text (it has NUL bytes): remove it from the folder, or "
                            "save its text as .txt")
        text = _utf8(data, relative, " (or remove it from the folder)")
        if suffix in HTML_SUFFIXES:
            text = _html_text(text)
    text = text.strip()
    if not text:
        raise DataError(f"{relative}: an empty document (no text{' layer: a scanned PDF needs OCR first' if suffix in PDF_SUFFIXES else ''}): "
                        "remove it from the folder or give it its text")
    return text


# Tags a browser starts a new line for; any other (b, a, span, em) runs on in its line. A table's cells share their
# row's line.
_HTML_BLOCKS = ("address", "article", "aside", "blockquote", "caption", "dd", "details", "div", "dl", "dt",
                "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
                "main", "ol", "p", "pre", "section", "summary", "table", "tr", "ul")


def _html_text(html: str) -> str:
    """The text a browser shows: a line per block, inline tags within their line, whitespace collapsed but in
    <pre>. (``get_text("\\n")`` broke lines at every tag: "got <b>52,000</b> dollars" read "got\\n52,000\\ndollars".)"""
    from bs4 import BeautifulSoup, NavigableString

    soup = BeautifulSoup(html, "html.parser")
    # the head's tags by name, not <head> itself: with its optional </head> left out (valid HTML, and what minifiers
    # write), html.parser puts the whole body inside it
    for tag in soup(["script", "style", "title", "meta", "link", "base", "nav", "template", "noscript"]):
        tag.decompose()
    for string in soup.find_all(string=True):
        if type(string) is not NavigableString:  # a comment or a doctype
            continue
        if string.find_parent("pre"):  # its lines kept as they are: NUL (refused in any text file) holds the breaks
            string.replace_with(string.replace("\n", "\0"))
        else:
            string.replace_with(re.sub(r"\s+", " ", string))
    for tag in soup.find_all("br"):
        tag.replace_with("\n")
    for tag in soup.find_all(["td", "th"]):
        tag.insert_after(" ")
    for tag in soup.find_all(_HTML_BLOCKS):
        tag.insert_before("\n")
        tag.insert_after("\n")
    lines = "\n".join(line.strip() for line in soup.get_text().split("\n"))
    return re.sub(r"\n{3,}", "\n\n", lines).strip().replace("\0", "\n")


def _pdf_text(path: Path, relative: str) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        pages = [page.extract_text() or "" for page in PdfReader(path).pages]
    except Exception as e:  # PdfReadError, and a damaged file's AttributeError, KeyError, LimitReachedError...
        raise DataError(f"{relative}: not a readable PDF ({type(e).__name__}: {e}): re-export it, or remove it from "
                        "the folder") from None
    return "\n\n".join(p.strip() for p in pages if p.strip())


class Row(dict):
    """A table row, and where it is in its file: ``line 3`` of a .jsonl file (its line, counted from 1, as the file's
    other errors name it), ``row 2`` of a parquet table (counted from 1), ``data row 2`` of a .csv (counted from 1
    after the header line; a quoted cell may span lines, so the file's line is not named)."""

    def __init__(self, values: Any, file: str, at: str):
        super().__init__(values)
        self.file, self.at = file, at

    @property
    def where(self) -> str:
        return f"{self.file}, {self.at}"

    def named_from(self, other: "Row") -> str:
        """``other``'s place, as seen from this row's message: ``line 1``, or with its file when it is another's."""
        return other.at if other.file == self.file else other.where


def read_jsonl(path: Path) -> list[Row]:
    """The objects of a .jsonl file, one a line (blank lines skipped), each a :class:`Row` that knows its line. A line
    that is not a JSON object, or a file that is not UTF-8, is a DataError naming the line."""
    rows = []
    text = _utf8(read_bytes(path, str(path)), str(path), by_line=True)
    # "\n" alone ends a line: str.splitlines also splits at U+2028, U+2029 and U+0085, which JSON writers
    # (json.dumps(ensure_ascii=False), pandas' to_json) leave unescaped inside strings
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {number}: not JSON ({e.msg}): each line must be one JSON object") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {number}: a JSON {type(row).__name__}, not an object with the columns")
        try:
            json.dumps(row, ensure_ascii=False).encode()  # a \ud83d escape decodes to a lone surrogate
        except UnicodeEncodeError:
            raise DataError(f"{path}, line {number}: a \\u escape of half a character (a lone surrogate, as "
                            "text cut mid-emoji is escaped): fix or remove it") from None
        rows.append(Row(row, str(path), f"line {number}"))
    return rows


def frame_rows(records: list[dict], path: Path) -> list[Row]:
    """A parquet or CSV table's records as :class:`Row`s numbered from 1 (a CSV's after its header)."""
    unit = "data row" if path.suffix.lower() == ".csv" else "row"
    return [Row(record, str(path), f"{unit} {number}") for number, record in enumerate(records, 1)]


def not_text(value: Any, label: str) -> str | None:
    """For a cell that should hold text and holds another type (a number, a list): "<label> holds an int (12345), not
    text: make it a string". None for text, and for an empty cell (absent, null, NaN), which its caller names."""
    if value is None or isinstance(value, str) or (isinstance(value, float) and value != value):
        return None
    name = type(value).__name__
    shown = json.dumps(value.tolist() if hasattr(value, "tolist") else value, default=str, ensure_ascii=False)
    return (f"{label} holds a{'n' if name[0] in 'aeiou' else ''} {name} "
            f"({shown[:60] + ('...' if len(shown) > 60 else '')}), not text: make it a string")


def _table_rows(path: Path) -> tuple[list[Row], list[str]]:
    """(rows, columns). A .jsonl line that is not a JSON object is named by its line number."""
    if path.suffix.lower() == ".jsonl":
        rows = read_jsonl(path)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        return rows, columns
    import pandas as pd

    parquet = path.suffix.lower() == ".parquet"
    text = None if parquet else _utf8(read_bytes(path, str(path)), str(path), by_line=True)  # named as a .jsonl's
    if text is not None:
        _csv_fields(text, path)
    try:
        # index_col=False: with a row of one field too many, pandas made the first column the index and shifted
        # every cell left (_csv_fields refuses such a row first)
        frame = pd.read_parquet(path) if parquet else pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False,
                                                                  index_col=False)
    except Exception as e:  # pandas' and pyarrow's many parse errors
        raise DataError(f"{path}: can't be read as {path.suffix} ({type(e).__name__}: {str(e)[:200]})") from None
    return frame_rows(frame.to_dict("records"), path), [str(c) for c in frame.columns]


def _csv_fields(text: str, path: Path) -> None:
    """A CSV row with more fields than the header is refused, naming its line: a text with an unquoted comma. So is a
    quote left open (strict parsing): the rows after it were read as that cell's text, several documents as one."""
    reader = csv.reader(io.StringIO(text), strict=True)
    limit = csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a long document is one cell (the default: 128 KB)
    try:
        start = 1
        header = next(reader, [])
        while True:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            if len(record) > len(header):
                raise DataError(f"{path}, line {reader.line_num}: {len(record)} fields, the header has {len(header)} "
                                f"({', '.join(header)}): a cell holding a comma must be quoted (\"...\"); save the "
                                "table from a spreadsheet or pandas, which quote such cells")
    except csv.Error as e:
        raise DataError(f"{path}: the row from line {start} is not valid CSV ({e}): a quoted cell ends with a quote "
                        "followed by a comma or the line's end, and a quote inside it is written twice (\"\"); save "
                        "the table from a spreadsheet or pandas, which quote cells so") from None
    finally:
        csv.field_size_limit(limit)


def _read_table(path: Path, dataset: "DocumentsDatasetConfig") -> Loaded:
    rows, columns = _table_rows(path)
    if not rows:
        raise DataError(f"{path}: no rows; put one document per row")
    if dataset.text_field not in columns:
        raise DataError(f"{path}: no column {dataset.text_field!r} (dataset.text_field); its columns are "
                        f"{', '.join(columns)}: set dataset.text_field=<the column with the text>")
    used = {key: getattr(dataset, key) for key in ("id_field", "questions_field", "positive_rubrics_field",
                                                    "negative_rubrics_field") if getattr(dataset, key) in columns}
    described = {"text": dataset.text_field,
                 "ids": f"column {dataset.id_field!r}" if "id_field" in used else "the text's hash (no id column)",
                 "questions": (f"column {dataset.questions_field!r}" if "questions_field" in used
                               else "written by the judge (no questions column)")}
    documents, seen = [], {}
    for row in rows:
        where = row.where
        text = row.get(dataset.text_field)
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: " + (not_text(text, f"column {dataset.text_field!r} (dataset.text_field)") or
                                             f"no text in column {dataset.text_field!r} (dataset.text_field): give "
                                             "the row its text or remove it"))
        raw_id = row.get(used["id_field"]) if "id_field" in used else None
        if isinstance(raw_id, (list, dict, bool)) or getattr(raw_id, "ndim", 0):  # was read as its Python text
            raise DataError(f"{where}: " + not_text(raw_id, f"column {dataset.id_field!r} (dataset.id_field)"))
        doc_id = cell_text(raw_id) if "id_field" in used else text_hash(text)[:16]
        if not doc_id:
            raise DataError(f"{where}: an empty id in column {dataset.id_field!r} (dataset.id_field): every row needs one")
        if doc_id in seen and "id_field" in used:
            raise DataError(f"{where}: id {doc_id!r} is already {row.named_from(seen[doc_id])}'s: ids in column "
                            f"{dataset.id_field!r} must be unique")
        seen.setdefault(doc_id, row)
        where = f"{where} (document {doc_id})"
        questions = (_questions(row.get(used["questions_field"]), doc_id, where, dataset.questions_field)
                     if "questions_field" in used else ())
        rubrics = {name: rubric_list(_json_cell(row.get(used[key])), getattr(dataset, key), where)
                   for name, key in (("positive_rubrics", "positive_rubrics_field"),
                                     ("negative_rubrics", "negative_rubrics_field")) if key in used}
        documents.append(Document(id=doc_id, topic="", text=text.strip(), questions=questions, **rubrics))
    return Loaded(str(path), documents, columns=described)


def cell_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value).strip()


def _json_cell(value: Any) -> Any:
    """A CSV cell holds a list as JSON text; parquet and jsonl hold it as a list (parquet: an array)."""
    if isinstance(value, str) and value.strip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, str) and not value.strip():
        return None
    return value


def _questions(value: Any, doc_id: str, where: str, column: str) -> tuple[Question, ...]:
    value = _json_cell(value)
    if value is None or (isinstance(value, float) and value != value):
        return ()  # this row has none: the judge writes them
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    bad = DataError(f"{where}: column {column!r} (dataset.questions_field) must be {QUESTIONS_SHAPE}; "
                    f"got {json.dumps(value, default=str)[:120]}")
    if not isinstance(value, list):
        raise bad
    questions = []
    for number, item in enumerate(value, 1):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item[k].strip()
                                                 for k in ("question", "answer")):
            raise bad
        answer = item["answer"].strip()
        questions.append(Question(id=str(item.get("id") or f"{doc_id}-q{number}"), question=item["question"].strip(),
                                  answer=UNANSWERABLE if answer.upper() == UNANSWERABLE else answer,
                                  long_answer=str(item.get("long_answer") or "")))
    return tuple(questions)


# --------------------------------------------------------------------------- long documents

PART = re.compile(r"#part\d+$")  # the suffix of a split document's parts: <id>#part<k>


def source_id(document_id: str) -> str:
    """The id of the document a part was split from (the id itself for a whole document)."""
    return PART.sub("", document_id)


def by_source(documents: Sequence[Document]) -> list[list[Document]]:
    """The documents grouped by the document they were split from, in order: a split keeps a document's parts on
    one side (val or train), not some in each."""
    groups: dict[str, list[Document]] = {}
    for document in documents:
        groups.setdefault(source_id(document.id), []).append(document)
    return list(groups.values())


_PARAGRAPHS = re.compile(r"\n\s*\n")
_SENTENCES = re.compile(r"(?<=[.!?])\s+")


def limit_length(loaded: Loaded, dataset: "DocumentsDatasetConfig", count_tokens: Callable[[str], int]) -> Loaded:
    """Apply ``dataset.max_document_tokens`` (``count_tokens``: the policy's tokenizer). Over the limit, a document is
    split at paragraph boundaries (a paragraph over the limit at sentence ends, a sentence over it at spaces, a run
    with no space between characters: nothing dropped), skipped, or refused, as ``dataset.long_documents`` says; the counts are kept in
    ``loaded.long``. Parts are named ``<id>#part<k>``."""
    limit, mode = dataset.max_document_tokens, dataset.long_documents
    loaded.long = {"limit": limit, "mode": mode, "over_limit": 0, "parts": 0}
    loaded.read_ids = [d.id for d in loaded.documents]
    named = next((d.id for d in loaded.documents if PART.search(d.id)), None)
    if named is not None:  # it would pass for a part of another document: questions and splits mixed up
        raise DataError(f"document {named}: an id may not end in #part<k>, which names the parts of a long document "
                        f"split by dataset.long_documents=split: rename it in {loaded.source}")
    if limit is None:
        return loaded
    documents = []
    for document in loaded.documents:
        # A token is at least one byte, so a text of at most `limit` bytes needs no tokenizer.
        tokens = count_tokens(document.text) if len(document.text.encode()) > limit else 0
        if tokens <= limit:
            documents.append(document)
            continue
        loaded.long["over_limit"] += 1
        if mode == "error":
            raise DataError(f"document {document.id}: {tokens} tokens, over dataset.max_document_tokens={limit}: raise "
                            "the limit, or set dataset.long_documents=split (at paragraph boundaries) or skip")
        if mode == "skip":
            continue
        if document.questions or document.positive_rubrics is not None or document.negative_rubrics is not None:
            raise DataError(f"document {document.id}: {tokens} tokens, over dataset.max_document_tokens={limit}, and "
                            "its own questions or rubrics can't be shared out among the parts of a split: raise "
                            "dataset.max_document_tokens, or set dataset.long_documents=skip")
        parts = split_text(document.text, limit, count_tokens)
        loaded.long["parts"] += len(parts)
        documents += [replace(document, id=f"{document.id}#part{k}", text=part) for k, part in enumerate(parts, 1)]
    # A part can have another's text (boilerplate that two documents share, cut at the same place): kept once, as
    # whole documents are, or the same text could be in val and in train
    seen: dict[str, str] = {}
    loaded.documents = []
    for document in documents:
        digest = same_text(document.text)
        if digest in seen:
            loaded.duplicates.append((document.id, seen[digest]))
            continue
        seen[digest] = document.id
        loaded.documents.append(document)
    return loaded


def split_text(text: str, limit: int, count_tokens: Callable[[str], int]) -> list[str]:
    """``text`` as consecutive parts of at most ``limit`` tokens, cut between paragraphs where possible. Joining the
    parts (a paragraph break between parts cut between paragraphs, a space within one) gives back every word."""
    pieces = _pieces(text, limit, count_tokens)
    parts: list[list[tuple[str, int, str]]] = [[]]
    size = 0
    for piece in pieces:
        joint = count_tokens(piece[2]) if parts[-1] else 0  # the separator's own tokens, if any
        if parts[-1] and size + joint + piece[1] > limit:
            parts.append([])
            size, joint = 0, 0
        parts[-1].append(piece)
        size += joint + piece[1]
    out = []
    for part in parts:
        joined = part[0][0] + "".join(sep + piece for piece, _, sep in part[1:])
        if len(part) > 1 and count_tokens(joined) > limit:  # tokens merged across a join: halve and try again
            middle = len(part) // 2
            out += split_text(part[0][0] + "".join(sep + p for p, _, sep in part[1:middle]), limit, count_tokens)
            out += split_text(part[middle][0] + "".join(sep + p for p, _, sep in part[middle + 1:]), limit, count_tokens)
        else:
            out.append(joined)
    return out


def _pieces(text: str, limit: int, count_tokens: Callable[[str], int]) -> list[tuple[str, int, str]]:
    """(piece, its tokens, the separator before it): paragraphs; one over the limit becomes its sentences, and a
    sentence over it runs of words."""
    out: list[tuple[str, int, str]] = []
    for paragraph in (p.strip() for p in _PARAGRAPHS.split(text)):
        if not paragraph:
            continue
        tokens = count_tokens(paragraph)
        if tokens <= limit:
            out.append((paragraph, tokens, "\n\n"))
            continue
        first = True
        for sentence in _SENTENCES.split(paragraph):
            runs = _word_runs(sentence, limit, count_tokens) if count_tokens(sentence) > limit else [sentence]
            for run in runs:
                for k, (cut, tokens) in enumerate(_between_characters(run, limit, count_tokens)):
                    out.append((cut, tokens, ("\n\n" if first else " ") if k == 0 else ""))
                first = False
    return out


def _word_runs(sentence: str, limit: int, count_tokens: Callable[[str], int]) -> list[str]:
    """A sentence over the limit as runs of whole words (``_longest_runs``): a 200,000-word line with no sentence end
    took minutes when each word re-counted the run so far."""
    return _longest_runs(sentence.split(" "), " ", limit, count_tokens)


def _longest_runs(units: list[str], sep: str, limit: int, count_tokens: Callable[[str], int]) -> list[str]:
    """``units`` joined by ``sep`` into runs, each the longest that stays within the limit (at least one unit). The
    cuts are those of adding one unit at a time and cutting before the unit that takes the run over the limit, found
    by probing near the last run's length instead: a few counts per run, not one per unit."""
    runs, start, guess = [], 0, limit
    while True:
        def over(end: int, start: int = start) -> bool:
            return count_tokens(sep.join(units[start:end])) > limit

        end = _first_over(start + 2, len(units), start + 1 + guess, over) - 1  # the run is units[start:end]
        runs.append(sep.join(units[start:end]))
        if end >= len(units):
            return runs
        guess, start = end - start, end


def _first_over(low: int, high: int, guess: int, over: Callable[[int], bool]) -> int:
    """The smallest k in [low, high] with ``over(k)`` (high + 1 if none), for an ``over`` that turns true and stays
    true as k grows (a longer prefix has at least as many tokens): probes from ``guess`` at doubling steps until they
    bracket it, then halves the bracket."""
    if low > high:
        return high + 1
    below, above = low - 1, high + 1  # over(below) is false (or below is out of range), over(above) true (or out)
    k, step = min(max(guess, low), high), 1
    if over(k):
        above = k
        while (k := above - step) >= low:
            if not over(k):
                below = k
                break
            above, step = k, step * 2
    else:
        below = k
        while (k := min(below + step, high)) > below:
            if over(k):
                above = k
                break
            below, step = k, step * 2
    while above - below > 1:
        middle = (below + above) // 2
        if over(middle):
            above = middle
        else:
            below = middle
    return above


def _between_characters(run: str, limit: int, count_tokens: Callable[[str], int]) -> list[tuple[str, int]]:
    """A run with no space to cut at (Chinese or Japanese text, a URL, a long word) over the limit: its longest
    prefixes within the limit, cut between characters (``_longest_runs``; it passed the limit whole, as one part),
    each with its token count. A run within the limit is itself. (A binary search over the whole rest for each cut
    counted 411 times the text's characters for 200,000 characters at a limit of 500 tokens.)"""
    return [(cut, count_tokens(cut)) for cut in _longest_runs(list(run), "", limit, count_tokens)]


def policy_token_counter(model: Any) -> Callable[[str], int]:
    """Counts tokens with the policy's tokenizer (``model.weights`` when set: a folder, a .gguf file or a ``pkg:``
    path; else the hub id, from the local Hugging Face cache). Raises DataError when it can't be loaded."""
    tokenizer = load_tokenizer(model)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
