"""dataset=documents: reading a folder or a table, bad input, long documents, and questions written by the judge
(the loopback judge, a real HTTP server) or offline, checked open and closed book, cached, and paid for only after
the cost guard. The offline end-to-end run on the fixture folder is test_train_e2e's weighted qa + rubric run."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from summrl.config import DocumentsDatasetConfig
from summrl.data import DataError, split, split_counts
from summrl.data.documents import limit_length, read, split_text
from summrl.judges.questions import OfflineQuestionWriter, QuestionSettings
from summrl.splits import QuestionsNotConfirmed, load
from summrl.testing import GENERAL_KNOWLEDGE, FakeLLM, Reply
from tests.conftest import ROOT, compose_config

FIXTURE = ROOT / "tests" / "fixtures" / "documents"


def words(text: str) -> int:
    """A stand-in tokenizer: one token per word."""
    return len(text.split())


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF whose text layer is ``text`` (Helvetica), with a correct cross-reference table."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def dataset(path, **settings) -> DocumentsDatasetConfig:
    return DocumentsDatasetConfig(path=str(path), **settings)


def config_for(path, tmp_path, *overrides):
    return compose_config(["experiment=local", "dataset=documents", f"dataset.path={path}",
                           f"dataset.questions.cache_dir={tmp_path / 'questions'}", *overrides])


# --------------------------------------------------------------------------- reading


def test_a_link_to_a_folder_in_the_tree_is_left_out_and_the_folder_keeps_its_own_path(tmp_path):
    """In sorted order the first path owned a folder: a link "archive -> reports" added beside it renamed its documents
    to archive/..., reshuffling val and train and refusing the run's resume, and reports was listed as the link (a
    documents audit). A link to a folder outside is still read under its own name."""
    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE / "contracts", folder / "reports")
    (folder / "other.md").write_text("The other note says the depot opened on May 3, 2021.")
    (folder / "archive").symlink_to(folder / "reports")
    (folder / "deep").mkdir()
    (folder / "deep" / "latest").symlink_to(folder / "reports")  # walked after reports/ either way
    (folder / "a-latest").symlink_to(folder / "deep")  # sorted before deep/
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "memo.md").write_text("The ferry schedule changes on April 2.")
    (folder / "b-outside").symlink_to(outside)
    loaded = read(dataset(folder))
    assert sorted(d.id for d in loaded.documents) == ["b-outside/memo.md", "other.md", "reports/lease-harbor-street.md",
                                                      "reports/supply-agreement.md"]
    assert sorted(loaded.skipped_files) == [("a-latest", "a link to a folder read already"),
                                            ("archive", "a link to a folder read already"),
                                            ("deep/latest", "a link to a folder read already")]


def test_a_file_name_that_is_not_utf8_is_refused_naming_it_and_one_left_out_is_listed_printable(tmp_path):
    """A Latin-1 name (café.txt from an old archive) was read, passed inspect and prepare, then ended training with a
    UnicodeEncodeError when its id was hashed for a seed (a documents audit). One left out was printed as it was."""
    import os

    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE / "contracts", folder)
    logo = os.fsdecode(bytes(folder) + b"/logo caf\xe9.png")
    Path(logo).write_bytes(b"\x89PNG\r\n\x1a\n")
    loaded = read(dataset(folder))
    assert ("logo caf\\xe9.png", "not txt/md/markdown/html/htm/pdf") in loaded.skipped_files
    print(loaded.skipped_files)  # printable: it raised UnicodeEncodeError
    Path(os.fsdecode(bytes(folder) + b"/caf\xe9 notes.txt")).write_text("Ren\u00e9 Dubois opened the cafe in 1962.")
    with pytest.raises(DataError, match=re.escape("caf\\xe9 notes.txt: its name is not UTF-8 (the \\x bytes): "
                                                  "rename it, e.g. convmv -f latin1 -t utf-8 --notest, or move it "
                                                  f"out of dataset.path={folder}")):
        read(dataset(folder))


def test_a_folder_is_read_with_relative_paths_as_ids_html_and_pdf_included_and_other_files_listed(tmp_path):
    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE, folder)
    (folder / "notes.html").write_text("<html><head><title>x</title><style>p {}</style></head><body><h1>Budget</h1>"
                                       "<!-- draft --><p>The Orchard Street library got <b>52,000</b>\n   dollars "
                                       "in <a href='#'>2025</a>.</p><ul><li>Roof</li><li>Windows</li></ul>"
                                       "<p>Signed<br>J. Ortiz</p><script>var secret = 1;</script></body></html>")
    (folder / "scan.pdf").write_bytes(minimal_pdf("The Quarry Lane depot opened on May 3, 2021."))
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / ".DS_Store").write_bytes(b"\x00\x01")
    (folder / "moved.md").symlink_to(folder / "no-longer-here.md")  # dropped without a word, before
    shared = tmp_path / "shared"  # a folder linked in: its documents were left out, unlisted
    shared.mkdir()
    (shared / "linked-memo.md").write_text("The ferry schedule changes on April 2.")
    (folder / "from-shared").symlink_to(shared)
    (shared / "loop").symlink_to(folder)  # a link back: read once, listed
    loaded = read(dataset(folder))
    ids = [d.id for d in loaded.documents]
    assert "incidents/2024-03-outage.md" in ids and "contracts/supply-agreement.md" in ids and len(ids) == 13
    assert "from-shared/linked-memo.md" in ids
    html = next(d for d in loaded.documents if d.id == "notes.html")
    # a line per block, as a browser shows it: inline tags and the source's line breaks were line breaks
    assert html.text == ("Budget\n\nThe Orchard Street library got 52,000 dollars in 2025.\n\nRoof\n\nWindows\n\n"
                         "Signed\nJ. Ortiz")
    pdf = next(d for d in loaded.documents if d.id == "scan.pdf")
    assert pdf.text == "The Quarry Lane depot opened on May 3, 2021."
    assert dict(loaded.skipped_files) == {".DS_Store": "hidden", "logo.png": "not txt/md/markdown/html/htm/pdf",
                                          "moved.md": "a broken link",
                                          "from-shared/loop": "a link to a folder read already"}
    assert any("skipped 4 file(s)" in line and "logo.png" in line for line in loaded.lines())
    assert all(not d.questions for d in loaded.documents)


def test_a_pipe_is_skipped_and_what_cant_be_read_is_named_not_passed_over(tmp_path, monkeypatch):
    """An audit: a named pipe with a readable suffix blocked the run for ever; a folder the run's user may not list
    was left out without a word (8 of 10 documents); a file it may not read was a PermissionError traceback. (Root
    reads everything, so the permission errors are raised here as the system raises them for another user.)"""
    import os

    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE, folder)
    os.mkfifo(folder / "pipe.txt")
    loaded = read(dataset(folder))
    assert len(loaded.documents) == 10 and dict(loaded.skipped_files) == {"pipe.txt": "not a regular file"}
    (folder / "pipe.txt").unlink()
    scandir = os.scandir

    def no_listing(path="."):
        if Path(path).name == "incidents":
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", no_listing)
    with pytest.raises(DataError, match=re.escape("incidents: can't be read (Permission denied): fix its "
                                                  f"permissions, or move it out of dataset.path={folder}")):
        read(dataset(folder))
    monkeypatch.setattr(os, "scandir", scandir)
    read_bytes = Path.read_bytes

    def no_reading(path):
        if path.name == "hiring-memo.md":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", no_reading)
    with pytest.raises(DataError, match=re.escape("hiring-memo.md: can't be read (Permission denied): fix its "
                                                  "permissions, or remove it")):
        read(dataset(folder))


def test_duplicate_documents_are_kept_once_and_reported(tmp_path):
    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE, folder)
    shutil.copy(folder / "town-council.md", folder / "zz-copy.md")
    # the same text saved on Windows: its line endings differ (a copy in val, the other in train, inflated val)
    (folder / "zz-windows.md").write_bytes((folder / "research-note.md").read_bytes().replace(b"\n", b"\r\n"))
    loaded = read(dataset(folder))
    assert [d.id for d in loaded.documents].count("zz-copy.md") == 0 and len(loaded.documents) == 10
    assert loaded.duplicates == [("zz-copy.md", "town-council.md"), ("zz-windows.md", "research-note.md")]
    assert loaded.record()["duplicates"][0] == {"id": "zz-copy.md", "same_text_as": "town-council.md"}
    assert any("2 duplicate document(s) kept once: zz-copy.md = town-council.md; zz-windows.md = research-note.md"
               in line for line in loaded.lines())


def test_a_jsonl_with_custom_column_names(tmp_path):
    path = tmp_path / "tickets.jsonl"
    rows = [{"ticket": f"T-{i}", "body": f"Ticket {i}: the printer in room {100 + i} jammed on June {i + 1}, 2025.",
             "extra": i} for i in range(4)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    loaded = read(dataset(path, text_field="body", id_field="ticket"))
    assert [d.id for d in loaded.documents] == ["T-0", "T-1", "T-2", "T-3"]
    assert loaded.documents[2].text.startswith("Ticket 2: the printer in room 102")
    assert loaded.columns["ids"] == "column 'ticket'" and "written by the judge" in loaded.columns["questions"]
    # without an id column, a document's id is its text's hash: the same whatever the row order
    again = read(dataset(path, text_field="body", id_field="nope"))
    reversed_path = tmp_path / "reversed.jsonl"
    reversed_path.write_text("\n".join(json.dumps(r) for r in reversed(rows)) + "\n")
    assert ({d.id: d.text for d in again.documents}
            == {d.id: d.text for d in read(dataset(reversed_path, text_field="body", id_field="nope")).documents})


def test_a_table_with_its_own_questions_needs_none_written(tmp_path):
    path = tmp_path / "own.csv"
    import pandas as pd

    texts = [f"Report {i}. The Harbor Festival in Port {i} drew {100 + i} visitors on June {i + 1}, 2024." for i in range(6)]
    questions = [json.dumps([{"question": f"How many visitors came to Port {i}?", "answer": str(100 + i)},
                             {"question": "Who opened it?", "answer": "unanswerable"}]) for i in range(6)]
    pd.DataFrame({"id": [f"r{i}" for i in range(6)], "text": texts, "questions": questions}).to_csv(path, index=False)
    config = config_for(path, tmp_path, "dataset.val_size=2")
    with FakeLLM() as server:  # an LLM judge that would be called if anything were written
        config.judge = compose_config(["judge=openai_compatible", f"judge.api_base={server.base_url}"]).judge
        splits = asyncio.run(load(config))
        assert server.requests == []
    assert len(splits.val) == 2 and len(splits.train) == 4
    doc = next(d for d in [*splits.val, *splits.train] if d.id == "r3")
    assert [(q.question, q.answer) for q in doc.questions] == [("How many visitors came to Port 3?", "103"),
                                                               ("Who opened it?", "UNANSWERABLE")]
    assert splits.record["questions"]["given"] == 6 and splits.record["questions"]["written"] == 0


BAD_INPUT = {
    "empty file": (lambda d: (d / "empty.md").write_text("  \n"), "empty.md: an empty document"),
    "binary file": (lambda d: (d / "blob.txt").write_bytes(b"ab\x00cd"), "blob.txt: a binary file, not text"),
    "not UTF-8": (lambda d: (d / "latin.txt").write_bytes("caf\xe9 au lait".encode("latin-1")),
                  "latin.txt: not UTF-8 (byte 0xe9 at offset 3): re-save it as UTF-8"),
    "nothing readable": (lambda d: [p.unlink() for p in d.rglob("*.md")] and (d / "a.docx").write_bytes(b"PK"),
                         "no readable document in this folder (found: a.docx)"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_files_fail_with_one_line_naming_the_file_and_the_fix(tmp_path, case):
    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE, folder)
    make, message = BAD_INPUT[case]
    make(folder)
    with pytest.raises(DataError, match=".*".join(map(__import__("re").escape, message.split(": ", 1)))):
        read(dataset(folder))


BAD_ROWS = {
    "no text column": ({"body": "x"}, "no column 'text' (dataset.text_field); its columns are body: set dataset.text_field="),
    "empty text": ({"text": " "}, "line 1: no text in column 'text'"),
    "questions not a list": ({"text": "A text.", "questions": {"q": 1}},
                             "column 'questions' (dataset.questions_field) must be a list of {\"question\""),
    "question without answer": ({"text": "A text.", "questions": [{"question": "Why?"}]},
                                "column 'questions' (dataset.questions_field) must be a list of {\"question\""),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_bad_rows_fail_naming_the_row_and_the_fix(tmp_path, case):
    row, message = BAD_ROWS[case]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError) as raised:
        read(dataset(path))
    assert str(raised.value).startswith(str(path)) and message in str(raised.value)


def test_a_bad_dataset_exits_2_with_its_line_before_anything_loads(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    result = subprocess.run([sys.executable, "-m", "summrl.data", "inspect", "experiment=local", "dataset=documents",
                             f"dataset.path={folder}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("summrl: config error: latin.txt: not UTF-8")
    assert "Traceback" not in result.stderr


def test_the_data_tools_answer_help_and_refuse_an_unknown_command_with_their_usage():
    for args in (["--help"], ["inspect", "--help"]):  # --help after the command was a Hydra override, and an error
        shown = subprocess.run([sys.executable, "-m", "summrl.data", *args], cwd=ROOT, capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 0 and "{inspect,prepare}" in shown.stdout and "inspect``: documents" in shown.stdout
    refused = subprocess.run([sys.executable, "-m", "summrl.data", "fetch"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "invalid choice: 'fetch'" in refused.stderr


def test_the_data_tools_refuse_an_inbox_with_one_line_naming_what_reads_it(caplog):
    from summrl.data.__main__ import main

    for command in ("inspect", "prepare"):
        caplog.clear()
        with pytest.raises(SystemExit) as ended:
            main([command, "experiment=local", "dataset=inbox"])
        assert ended.value.code == 2
        (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]  # the line exit_on prints
        assert line.startswith("summrl: config error: dataset=inbox: summrl.data reads dataset=documents or repliqa")
        assert "run.name=<name> dataset=inbox" in line and "Traceback" not in caplog.text


# --------------------------------------------------------------------------- long documents and split sizes


def long_folder(tmp_path):
    folder = tmp_path / "long"
    folder.mkdir()
    paragraphs = [" ".join(f"w{p}x{i}" for i in range(30)) + "." for p in range(5)]  # 5 paragraphs of 30 words
    (folder / "long.md").write_text("\n\n".join(paragraphs))
    (folder / "short.md").write_text("A short note of eight words in all.")
    return folder, paragraphs


def test_long_documents_split_at_paragraphs_with_nothing_lost_or_skip_counted(tmp_path):
    folder, paragraphs = long_folder(tmp_path)
    loaded = limit_length(read(dataset(folder, max_document_tokens=70)), dataset(folder, max_document_tokens=70), words)
    parts = [d for d in loaded.documents if d.id.startswith("long.md#part")]
    assert [d.id for d in parts] == ["long.md#part1", "long.md#part2", "long.md#part3"]
    assert all(words(d.text) <= 70 for d in parts)
    assert [p for d in parts for p in d.text.split("\n\n")] == paragraphs  # cut between paragraphs, nothing dropped
    assert loaded.long == {"limit": 70, "mode": "split", "over_limit": 1, "parts": 3}
    assert any("1 document(s) over dataset.max_document_tokens=70 split into 3 parts" in line for line in loaded.lines())
    skip = dataset(folder, max_document_tokens=70, long_documents="skip")
    loaded = limit_length(read(skip), skip, words)
    assert [d.id for d in loaded.documents] == ["short.md"] and loaded.long["over_limit"] == 1
    refuse = dataset(folder, max_document_tokens=70, long_documents="error")
    with pytest.raises(DataError, match="document long.md: 150 tokens, over dataset.max_document_tokens=70"):
        limit_length(read(refuse), refuse, words)


def test_a_part_with_another_parts_text_is_kept_once(tmp_path):
    """Two leases sharing their standard clauses, cut at the same place: the same part was in val and in train,
    where whole documents with the same text are kept once (found by an audit)."""
    folder, paragraphs = long_folder(tmp_path)
    (folder / "other.md").write_text("\n\n".join(paragraphs[:2] + [" ".join(f"y{i}" for i in range(30)) + "."]))
    settings = dataset(folder, max_document_tokens=70)
    loaded = limit_length(read(settings), settings, words)
    assert [d.id for d in loaded.documents if d.id.startswith("other.md")] == ["other.md#part2"]
    assert loaded.duplicates == [("other.md#part1", "long.md#part1")]
    assert "1 duplicate document(s) kept once: other.md#part1 = long.md#part1" in "\n".join(loaded.lines())


def test_a_paragraph_over_the_limit_is_cut_at_sentence_ends():
    text = "One two three. Four five six. Seven eight nine.\n\nTen."
    assert split_text(text, 6, words) == ["One two three. Four five six.", "Seven eight nine.\n\nTen."]
    long_sentence = " ".join(f"w{i}" for i in range(10))  # no sentence end: runs of words, none cut
    assert split_text(long_sentence, 4, words) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]


@pytest.mark.parametrize("train,val,expected", [("all", 0.1, (1, 9)), ("all", 3, (3, 7)), (0.5, "all", (5, 5)),
                                                (4, 0.2, (2, 4)), ("6", "2", (2, 6))])
def test_split_sizes_are_counts_fractions_or_all(train, val, expected):
    from summrl.config import split_size

    assert split_counts(10, split_size(train, "t"), split_size(val, "v"), "src") == expected


def test_fractions_that_add_up_to_one_fit_every_document_count():
    """Each rounded alone (half to even), 0.9 + 0.1 of 195 documents was 176 + 20, and refused."""
    for n in range(2, 400):
        for train, val in ((0.9, 0.1), (0.5, 0.5), (0.8, 0.2)):
            counted_val, counted_train = split_counts(n, train, val, "src")
            assert counted_val + counted_train <= n and counted_val >= 1 and counted_train >= 1, (n, train, val)


def test_split_sizes_the_data_cannot_meet_or_bad_values_are_refused():
    from summrl.errors import ConfigError

    with pytest.raises(DataError, match=r"^src: train_size \+ val_size = 8 \+ 5 documents, but only 10 documents are"):
        split_counts(10, 8, 5, "src")
    with pytest.raises(DataError, match=r"train_size \+ val_size = 0.9 \+ 3 = 9 \+ 3 documents, but only 10"):
        split_counts(10, 0.9, 3, "src")
    # only dataset=repliqa's sizes come from $TRAIN_SIZE / $VAL_SIZE: the fix names them there alone
    from types import SimpleNamespace

    for name, env_named in (("repliqa", True), ("repliqa_sample", False)):
        dataset = SimpleNamespace(kind="repliqa", name=name, train_size=8, val_size=5, seed=0)
        with pytest.raises(DataError, match="Lower dataset.train_size / dataset.val_size") as refused:
            split(list(range(10)), dataset, "src")
        assert ("TRAIN_SIZE / VAL_SIZE" in str(refused.value)) is env_named
    with pytest.raises(ConfigError, match="dataset.val_size: must be a count"):
        compose_config(["experiment=local", "dataset.val_size=most"])
    with pytest.raises(ConfigError, match="can't both be all"):
        compose_config(["experiment=local", "dataset.val_size=all", "dataset.train_size=all"])


# --------------------------------------------------------------------------- questions


def test_the_offline_writer_writes_extractive_cloze_questions_deterministically():
    writer = OfflineQuestionWriter()
    document = read(dataset(FIXTURE)).documents[0]
    first = asyncio.run(writer.write(document, 4, 1))
    assert first == asyncio.run(writer.write(document, 4, 1))
    assert len(first) == 5 and [answer == "UNANSWERABLE" for _, answer in first] == [False] * 4 + [True]
    for question, answer in first[:-1]:
        assert question.startswith('Fill in the blank: "') and "____" in question
        assert question.replace("____", answer).removeprefix('Fill in the blank: "').rstrip('"') in document.text
    assert first[-1][1] == "UNANSWERABLE"


def test_questions_are_written_once_through_the_judge_and_reruns_make_no_calls(tmp_path, capsys):
    with FakeLLM() as server:
        config = config_for(FIXTURE, tmp_path, "judge=openai_compatible", f"judge.api_base={server.base_url}",
                            "dataset.questions.confirm=false", "dataset.val_size=3")
        config.judge.cache_dir = None  # the question cache alone must spare the calls
        splits = asyncio.run(load(config))
        calls = len(server.requests)
        # 10 documents (val and train: reward=qa), each: 1 writing, 2 answering and at most 2 grading calls
        assert calls == 40  # closed book, every answerable question is missed: one grading call
        q = splits.record["questions"]
        assert q["generated_documents"] == 10 and q["written"] == 50 and q["written_now"] == 10
        assert q["kept"] == 50 and q["dropped"] == {"not_in_document": 0, "closed_book": 0, "answered_by_document": 0}
        assert q["closed_book_answer_rate"] == 0.0
        assert all(len(d.questions) == 5 for d in [*splits.val, *splits.train])
        again = asyncio.run(load(config))
        assert len(server.requests) == calls  # every question came from the cache
        assert again.record["questions"]["cache_hits"] == 10 and again.record["questions"]["written_now"] == 0
        assert [d.questions for d in again.val] == [d.questions for d in splits.val]
        # the folder saved with Windows' line endings: the same documents to the reader, and now to the cache (their
        # questions were written and paid for again)
        import hashlib

        from summrl.splits import question_bank

        crlf = tmp_path / "crlf"
        for source in FIXTURE.rglob("*.md"):
            target = crlf / source.relative_to(FIXTURE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
        windows = config_for(crlf, tmp_path, "judge=openai_compatible", f"judge.api_base={server.base_url}",
                             "dataset.questions.confirm=false", "dataset.val_size=3")
        windows.judge.cache_dir = None
        copied = asyncio.run(load(windows))
        assert len(server.requests) == calls and copied.record["questions"]["cache_hits"] == 10
        documents = [*copied.val, *copied.train]
        assert all("\r\n" in d.text for d in documents)  # the text itself is kept as read
        # an entry keyed by a CRLF text's own hash, as every one was before, is read, not paid for again
        bank = question_bank(windows)
        rest = (bank.writer.writer, bank.settings.per_document, bank.settings.unanswerable_share, bank.settings.check)
        for document in documents:
            earlier = bank.cache.path(hashlib.sha256(document.text.encode()).hexdigest(), *rest)
            bank.path(document).rename(earlier)
            assert bank.path(document) == earlier
        assert asyncio.run(load(windows)).record["questions"]["cache_hits"] == 10 and len(server.requests) == calls
        # an old entry that can't be read (an earlier row format) is written again, under the new key
        stale = bank.path(documents[0])
        stale.write_text(json.dumps({"questions": [{"question": "q"}]}))
        assert asyncio.run(load(windows)).record["questions"]["written_now"] == 1
        assert bank.path(documents[0]) == bank.path(documents[0], new=True) != stale


def test_the_check_drops_a_question_answered_closed_book_and_one_the_document_does_not_answer(tmp_path, monkeypatch):
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(FIXTURE / "volunteer-day.md", folder / "volunteer-day.md")
    shutil.copy(FIXTURE / "hiring-memo.md", folder / "hiring-memo.md")
    planted = {"questions": [
        {"question": "Complete: They collected 640 kilograms of litter and planted 75 young oak trees near the ____",
         "answer": "pond"},
        {"question": "Complete: On April 27, 2025 around 150 volunteers cleaned up Fernhill Park in ____",
         "answer": "Bristol"},  # in the document, and the judge knows it without it
        {"question": "Complete: The mayor of Bristol is ____", "answer": "Jones"},  # not in the document
        {"question": "What is the phone number of office 1?", "answer": "UNANSWERABLE"},
        {"question": "Complete: Local bakery Crumb and Co gave free bread rolls to every volunteer at ____",
         "answer": "noon"}]}
    monkeypatch.setitem(GENERAL_KNOWLEDGE, planted["questions"][1]["question"], "Bristol")
    with FakeLLM() as server:
        config = config_for(folder, tmp_path, "judge=openai_compatible", f"judge.api_base={server.base_url}",
                            "dataset.questions.confirm=false", "dataset.val_size=1", "dataset.train_size=1",
                            "dataset.seed=1", "reward=ruler")  # ruler: only the val document needs questions
        assert split(read(config.dataset).documents, config.dataset, "here")[0][0].id == "volunteer-day.md"
        server.script.append(Reply(json.dumps(planted)))  # the first call writes the val document's questions
        splits = asyncio.run(load(config))
    q = splits.record["questions"]
    assert q["per_document"]["volunteer-day.md"] == {
        "written": 5, "kept": 3, "dropped": {"not_in_document": 1, "closed_book": 1, "answered_by_document": 0}}
    assert [x.question for x in splits.val[0].questions] == [planted["questions"][i]["question"] for i in (0, 3, 4)]
    assert q["closed_book_answer_rate"] == pytest.approx(1 / 4)  # 4 answerable questions asked closed book
    assert splits.train[0].questions == ()  # reward=ruler: train documents need no questions


def test_paid_question_writing_is_estimated_budgeted_and_confirmed_before_any_call(tmp_path, monkeypatch, caplog):
    import logging

    with FakeLLM() as server:
        paid = ["judge=openai_compatible", "judge.model=gpt-4o-mini", f"judge.api_base={server.base_url}"]
        over = config_for(FIXTURE, tmp_path, *paid, "dataset.questions.max_cost_usd=0.0001")
        with caplog.at_level(logging.INFO, logger="summrl"), pytest.raises(QuestionsNotConfirmed) as refused:
            asyncio.run(load(over))
        assert "dataset.questions.max_cost_usd=0.0001: the estimate is $0.00" in str(refused.value)
        assert "over the budget; nothing was called" in str(refused.value)
        assert "10 documents to write questions for (0 cached): judge gpt-4o-mini:" in caplog.text
        monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
        with pytest.raises(QuestionsNotConfirmed, match="not confirmed; nothing was called"):
            asyncio.run(load(config_for(FIXTURE, tmp_path, *paid)))
        assert server.requests == []
        monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
        splits = asyncio.run(load(config_for(FIXTURE, tmp_path, *paid, "dataset.val_size=2")))
        assert server.requests and splits.record["questions"]["written_now"] == 10



def test_what_question_writing_paid_before_it_failed_stays_in_the_runs_record(tmp_path):
    """An invocation whose question writing failed part-way recorded no $; the rerun read what it had written from the
    cache at $0, so the run's record never counted it."""
    from summrl.job import RunRecord, read_result
    from summrl.loop import train
    from summrl.splits import QuestionsFailed

    with FakeLLM() as server:
        config = config_for(FIXTURE, tmp_path, "judge=openai_compatible", "judge.model=gpt-4o-mini",
                            f"judge.api_base={server.base_url}", "judge.max_retries=0",
                            "dataset.questions.confirm=false", f"run.dir={tmp_path / 'run'}")
        server.script.append(Reply(status=500))  # one document's questions fail; the others are written and paid
        with pytest.raises(QuestionsFailed):
            asyncio.run(train(config, RunRecord(config.run.dir)))
    spent = read_result(config.run.dir)["dataset"]["questions"]["cost_usd"]
    assert spent > 0 and len(server.requests) > 1


def test_questions_paid_for_are_on_disk_before_the_model_loads(tmp_path, monkeypatch):
    """result.json was first written after the step-0 val pass: a machine killed while the model loaded (minutes, for
    a GPU model) lost the questions' spend, and the rerun read them from the cache at $0 (found by an audit, with
    SIGKILL). What the run's folder holds as the model starts to load is what such a kill leaves."""
    import summrl.loop
    from summrl.job import RunRecord, read_result
    from summrl.loop import train

    class Killed(BaseException):
        pass

    left = {}

    async def loading(*args, **kwargs):
        left.update(read_result(config.run.dir) or {})
        raise Killed

    monkeypatch.setattr(summrl.loop, "open_session", loading)
    with FakeLLM() as server:
        config = config_for(FIXTURE, tmp_path, "judge=openai_compatible", "judge.model=gpt-4o-mini",
                            f"judge.api_base={server.base_url}", "dataset.questions.confirm=false",
                            f"run.dir={tmp_path / 'run'}")
        with pytest.raises(Killed):
            asyncio.run(train(config, RunRecord(config.run.dir)))
    questions = left["dataset"]["questions"]
    assert questions["written_now"] > 0 and questions["cost_usd"] > 0 and server.requests


def test_data_prepare_fills_the_cache_that_inspect_and_training_read(tmp_path, capsys, caplog, monkeypatch):
    import logging

    from summrl.data.__main__ import main

    caplog.set_level(logging.INFO, logger="summrl")
    args = ["experiment=local", "dataset=documents", f"dataset.path={FIXTURE}",
            f"dataset.questions.cache_dir={tmp_path / 'q'}", "dataset.max_document_tokens=null"]
    main(["inspect", *args])
    assert "summrl: questions: 10 documents to write questions for (0 cached), offline" in capsys.readouterr().out
    # it calls nothing: a paid judge's estimate needs no key (it ended in a config error before the estimate)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    main(["inspect", *args, "judge=gemini_flash"])
    out = capsys.readouterr().out
    assert "summrl: questions: 10 documents to write questions for (0 cached): judge gemini/gemini-2.5-flash" in out
    assert "writing them needs GEMINI_API_KEY (the judge's key): export it, or put it in .env" in out
    # prepare with the key missing: a preflight error (exit 3), as training's names the key (it was a config error)
    with pytest.raises(SystemExit) as refused:
        main(["prepare", *args, "judge=gemini_flash"])
    assert refused.value.code == 3
    said = capsys.readouterr().err + caplog.text  # (printed, or logged where an earlier test set logging up)
    assert ("question writing can't start yet:\n  - dataset=documents: the judge writes the questions, and its key "
            "GEMINI_API_KEY is not set") in said and "preflight error" in said
    main(["prepare", *args])
    out = capsys.readouterr().out
    assert "prepared 10 documents" in out and "10 written now, 0 from the cache" in out
    main(["inspect", *args])  # reads what prepare wrote
    assert "summrl: questions: all 10 documents' questions are cached; nothing to write" in capsys.readouterr().out
    caplog.clear()
    main(["prepare", *args])
    assert "0 written now, 10 from the cache" in capsys.readouterr().out
    assert "all 10 documents' questions are cached; nothing to write" in caplog.text
    splits = asyncio.run(load(config_for(FIXTURE, tmp_path, f"dataset.questions.cache_dir={tmp_path / 'q'}")))
    assert splits.record["questions"]["cache_hits"] == 10 and splits.record["questions"]["written_now"] == 0


def test_a_val_document_kept_as_another_documents_part_is_named_as_such_not_as_too_long(tmp_path):
    """A file that is exactly a part of a longer one (an excerpt saved apart) is kept once, as the part. Drawn as the
    only val document, the refusal said it was over the length limit, and to split, which was the setting in use (a
    documents audit)."""
    from summrl.splits import read_documents, split_whole

    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE / "contracts", folder)
    first = " ".join(f"The harbor board met on March {i} and approved {10 + i} new moorings." for i in range(1, 16))
    second = " ".join(f"The ferry ran {i} extra crossings on route {30 + i} in June." for i in range(1, 16))
    (folder / "a-report.txt").write_text(f"{first}\n\n{second}")
    (folder / "b-excerpt.txt").write_text(second)
    args = ["experiment=local", "dataset=documents", f"dataset.path={folder}", "dataset.val_size=1",
            "dataset.max_document_tokens=300", "dataset.long_documents=split"]
    for seed in range(100):
        config = compose_config([*args, f"dataset.seed={seed}"])
        loaded = read_documents(config, report=False)
        assert ("b-excerpt.txt", "a-report.txt#part2") in loaded.duplicates
        try:
            split_whole(loaded, config.dataset)
        except DataError as e:
            assert str(e) == ("the val documents (b-excerpt.txt) are each the text of another document's part, kept "
                              f"once there (a-report.txt#part2): remove the copies from {folder}, or another "
                              "dataset.seed")
            break
    else:
        pytest.fail("no seed drew b-excerpt.txt as the val document")


def test_data_prepare_names_what_the_question_check_leaves_out_and_refuses_as_training_would(tmp_path, capsys, caplog):
    """prepare printed its totals alone: a val document none of whose questions a summary must answer passed went
    unnamed, prepare exited 0, and the run it prepared for was refused (a documents audit)."""
    import logging

    from summrl.data.__main__ import main
    from summrl.splits import read_documents, split_whole

    caplog.set_level(logging.INFO, logger="summrl")
    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE, folder)
    (folder / "prose.txt").write_text("the weather was mild and the river ran slowly past the old mill, as it does.")
    args = ["experiment=local", "dataset=documents", f"dataset.path={folder}", "dataset.val_size=1",
            f"dataset.questions.cache_dir={tmp_path / 'q'}"]
    seed = next(seed for seed in range(100) if [d.id for d in split_whole(read_documents(compose_config(
        [*args, f"dataset.seed={seed}"]), report=False), compose_config([*args, f"dataset.seed={seed}"]).dataset)[0]]
        == ["prose.txt"])
    with pytest.raises(SystemExit) as refused:
        main(["prepare", *args, f"dataset.seed={seed}"])
    assert refused.value.code == 2
    assert "1 document(s) left out, none of their questions that a summary must answer passed the check: prose.txt" in (
        caplog.text)
    assert "after the question check, 0 val and 10 train documents are left: add documents, or change " in caplog.text


def test_data_prepare_and_inspect_split_a_folder_with_a_split_document_as_training_does(tmp_path, capsys):
    """A long document's parts: summrl.data shuffled the parts one by one, training shuffles whole documents, so
    prepare wrote the questions of other val documents than training's (which then wrote its own), and inspect
    printed other split sizes."""
    from summrl.data.__main__ import main

    folder = tmp_path / "docs"
    shutil.copytree(FIXTURE, folder)
    (folder / "long.md").write_text("\n\n".join(f"Section {i}. " + f"The {20 + i} committee members reviewed the "
                                                 "budget line by line. " * 8 for i in range(8)))
    for seed in range(4):
        args = ["experiment=local", "dataset=documents", f"dataset.path={folder}", "reward=ruler",
                f"dataset.questions.cache_dir={tmp_path / f'q{seed}'}", "dataset.max_document_tokens=200",
                "dataset.val_size=0.3", f"dataset.seed={seed}"]
        main(["prepare", *args])
        main(["inspect", *args])
        shown = re.search(r"split \(dataset.seed=\d+\): (\d+) val, (\d+) train", capsys.readouterr().out)
        splits = asyncio.run(load(compose_config(args)))
        assert any("#part" in d.id for d in splits.val + splits.train)
        assert (int(shown[1]), int(shown[2])) == (len(splits.val), len(splits.train)), seed
        assert splits.record["questions"]["written_now"] == 0, seed  # prepare wrote what training reads


def test_on_a_cloud_gpu_the_documents_travel_in_the_project_folder(tmp_path):
    from summrl.cloud.launch import preflight, remote_command

    cloud = ["dataset=documents", "dataset.questions.confirm=false"]  # the defaults: backend=skypilot, a paid judge
    config = compose_config([*cloud, f"dataset.path={FIXTURE}"])
    command = remote_command(config, [*cloud, f"dataset.path={FIXTURE}"])
    assert compose_config(shlex.split(command)[3:]).dataset.path == "tests/fixtures/documents"  # as on the cluster
    assert str(ROOT) not in command
    assert not [p for p in preflight(config) if "dataset.path" in p]
    outside = compose_config([*cloud, f"dataset.path={tmp_path}"])
    assert any(p.startswith(f"dataset.path={tmp_path} is outside the project folder") for p in preflight(outside))


def test_a_tokenizer_that_cannot_be_read_names_the_fix_the_caller_can_make(tmp_path):
    """Training and summrl.data can change model.weights or the token limit; summrl.serve serves a run's own model and
    passes its own fix (the run's config), since neither key is one of its settings."""
    from types import SimpleNamespace

    from summrl.data.tokenizer import load_tokenizer

    model = SimpleNamespace(base_model="no-such-org/no-such-model", weights=str(tmp_path))  # a folder with no tokenizer
    with pytest.raises(DataError, match=r"can't load the policy's tokenizer.*dataset\.max_document_tokens=null$"):
        load_tokenizer(model)
    with pytest.raises(DataError, match=r"with no network, the run's model\.weights .* must be readable here$") as e:
        load_tokenizer(model, "the run's model.weights (runs/x/.hydra/config.yaml) must be readable here")
    assert "max_document_tokens" not in str(e.value)


def test_an_inbox_line_a_crash_cut_short_is_skipped_and_the_documents_recorded_after_it_are_kept(tmp_path):
    """A crash mid-record left a line cut short, and the next record was written onto it: the merged line stopped
    every dataset=inbox run (not JSON), and removing it lost the whole document after it."""
    from summrl import inbox

    recorder = inbox.Recorder(tmp_path)
    recorder.record("a", "first document", 1)
    with recorder.path.open("ab") as f:
        f.write(b'{"id": "b", "text": "a document cut sho')  # the crash
    recorder.record("c", "third document", 1)
    got = inbox.read(tmp_path)
    assert [(r["id"], r["line"]) for r in got.rows] == [("a", 0), ("c", 2)] and got.cut_short == 1


def test_an_inbox_last_line_without_its_newline_waits_for_it_and_the_next_run_is_not_refused(tmp_path):
    """A last line of complete JSON but no newline yet (still being written) was trained with no hash in the
    watermark, and the next run was refused as an inbox "replaced, cut or edited"."""
    from summrl import inbox

    recorder = inbox.Recorder(tmp_path)
    recorder.record("a", "first document", 1)
    with recorder.path.open("ab") as f:
        f.write(b'{"id": "b", "text": "second document", "time": 0, "step": 1}')
    got = inbox.read(tmp_path)
    assert [r["id"] for r in got.rows] == ["a"] and got.cut_short == 1
    inbox.mark(tmp_path, 2, got.rows[-1]["line"] + 1)  # an online step trains what it read
    inbox.check_watermark(tmp_path, 2, 4)  # the next run, before the line ends: not refused
    recorder.record("c", "third document", 2)  # its newline comes first
    assert [(r["id"], r["line"]) for r in inbox.read(tmp_path).rows] == [("a", 0), ("b", 1), ("c", 2)]
    assert inbox.online(tmp_path, 2, [], {}, set(), 4).start == 1  # b is trained next


def test_an_unreadable_inbox_watermark_stops_the_run_instead_of_training_every_document_again(tmp_path):
    """Read as empty (as it was), a damaged watermark sent every recorded document back into training."""
    from summrl import inbox
    from summrl.data import DataError

    assert inbox.watermark(tmp_path) == {}  # no online step yet
    inbox.mark(tmp_path, 1, 8)
    assert inbox.consumed_at(tmp_path, 1) == 8
    path = tmp_path / "inbox" / "watermark.json"
    for damaged in (b'{"consumed": {"1": 8', b"\xff\xfe", b"[]", b'{"consumed": {"1": "eight"}}'):
        path.write_bytes(damaged)
        with pytest.raises(DataError, match=r"^" + re.escape(f"{path} is unreadable (") + r".*trained on\. Restore it "
                           r"from a backup, or delete it to train on the whole inbox again"):
            inbox.consumed_at(tmp_path, 1)
        with pytest.raises(DataError):
            inbox.mark(tmp_path, 2, 16)  # not written over with a watermark that forgets step 1
        assert path.read_bytes() == damaged


def test_an_inbox_replaced_or_cut_under_its_watermark_or_a_new_val_size_is_refused(tmp_path):
    """The watermark counts lines: an inbox archived (a new file), restored from an older copy or cut had the
    documents recorded since, up to the old count, skipped without a word; a larger dataset.val_size took documents
    already trained on into val."""
    from summrl import inbox
    from summrl.data import DataError, Document

    recorder = inbox.Recorder(tmp_path)
    for i in range(10):
        recorder.record(f"d{i}", f"document {i}", 1)
    original = recorder.path.read_bytes()
    batch = inbox.online(tmp_path, 1, [], {}, set(), 4)
    batch.before_step(inbox.Batch(1, [], 6))  # step 2 consumes lines 0-5
    documents = [Document(id=f"d{i}", topic="", text=f"document {i}", questions=()) for i in range(10)]
    found = inbox.online(tmp_path, 2, documents, {f"d{i}": i for i in range(10)}, {"d0", "d1", "d2", "d3"}, 4)
    assert [d.id for d, _ in found.new] == ["d6", "d7", "d8", "d9"]
    shifted = b"\n".join(original.split(b"\n")[1:])  # archived: the new file's lines are other documents
    for inbox_now in (b"\n".join(original.split(b"\n")[:3]) + b"\n", shifted + shifted):
        recorder.path.write_bytes(inbox_now)
        with pytest.raises(DataError, match=re.escape(f"{recorder.path}: line 6 is not the last line this run had "
                                                      "trained on by step 2") + ".*Put the original file back"):
            inbox.online(tmp_path, 2, [], {}, set(), 4)
    recorder.path.write_bytes(original)
    recorder.record("d10", "document 10", 2)  # appended after the original: the run goes on
    assert inbox.online(tmp_path, 2, [], {}, set(), 4).start == 6
    with pytest.raises(DataError, match=r"^dataset.val_size=8: this run's online val set is the first 4 recorded "
                                        r"documents .* set dataset.val_size=4$"):
        inbox.online(tmp_path, 2, [], {}, set(), 8)


def test_an_inbox_run_says_which_recorded_documents_it_leaves_out(tmp_path, caplog):
    """A document served twice, and one over dataset.max_document_tokens (skipped: the watermark then passes it),
    were left out with nothing said but a count in result.json."""
    import logging

    from summrl import inbox
    from summrl.splits import load_inbox

    caplog.set_level(logging.INFO, logger="summrl")
    recorder = inbox.Recorder(tmp_path)
    for i in range(6):  # (a fact each, two digits: the offline writer's questions must have one to ask about)
        recorder.record(f"d{i}", f"The council met on day {i + 10} and approved item {i + 20}.", 1)
    recorder.record("again", "The council met on day 12 and approved item 22.\r\n", 1)  # served twice
    recorder.record("long", " ".join(["The harbor budget grew by 12 percent again."] * 40), 1)
    config = compose_config(["experiment=local", "dataset=inbox", "reward=ruler", f"run.dir={tmp_path}",
                             "dataset.max_document_tokens=60", f"dataset.questions.cache_dir={tmp_path / 'q'}"])
    splits = asyncio.run(load_inbox(config))
    assert [d.id for d in splits.train] == ["d4", "d5"]
    assert "summrl: dataset: 1 duplicate document(s) kept once: again (line 7) = d2" in caplog.text
    assert "summrl: dataset: 1 document(s) over dataset.max_document_tokens=60 skipped" in caplog.text



def test_an_inbox_run_that_trains_nothing_keeps_the_runs_best_by_and_config(tmp_path):
    """reward=qa with nothing new ("nothing to train", exit 0) rewrote a RULER run's best_by (val_qa_accuracy ->
    val_reward) and config: step=best (serve, export, benchmark) then picked another checkpoint. So did a run that
    failed before its first step."""
    from summrl import inbox
    from summrl.errors import ConfigError
    from summrl.job import RunRecord, read_result, write_result
    from summrl.loop import train

    earlier = {"status": "completed", "steps": 3, "best_by": "val_qa_accuracy", "seed": 42,
               "config": {"reward": "ruler", "reward.kind": "ruler"}, "algorithm": {"kind": "grpo"},
               "choices": {"reward": "ruler"}, "overrides": ["reward=ruler"], "wall_s": 9.0,
               "val_history": [{"step": 3, "val_reward": 0.5, "val_qa_accuracy": 0.4}]}
    write_result(tmp_path, earlier)
    recorder = inbox.Recorder(tmp_path)
    for i in range(4):  # the online val set only: nothing new to train
        recorder.record(f"d{i}", f"The council met on day {i + 10} and approved item {i + 20}.", 1)
    args = ["experiment=local", "dataset=inbox", "reward=qa", f"run.dir={tmp_path}",
            f"dataset.questions.cache_dir={tmp_path / 'q'}"]
    assert asyncio.run(train(compose_config(args), RunRecord(tmp_path))) is None  # nothing to train
    kept = {k: earlier[k] for k in ("best_by", "config", "algorithm", "seed", "choices", "overrides")}
    saved = read_result(tmp_path)
    assert {k: saved[k] for k in kept} == kept and saved["status"] == "completed"
    recorder.record("d4", "The council met on day 14 and approved item 24.", 1)  # new, but refused before step 1
    with pytest.raises(ConfigError, match="algorithm.kl_penalty_reference_step=5"):
        asyncio.run(train(compose_config([*args, "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=5"]),
                        RunRecord(tmp_path)))
    saved = read_result(tmp_path)  # the run is as it was: a resume refused before it trained changed nothing
    assert {k: saved[k] for k in kept} == kept and saved["status"] == "completed" and "error" not in saved
    # an earlier invocation that trained nothing (a config error) is no run to keep the settings of: the next
    # invocation's own are recorded, and the same command resumes it
    write_result(tmp_path, {"status": "failed", "error_kind": "config", "seed": 7, "best_by": "val_reward",
                            "config": {"dataset": "documents"}})
    record = RunRecord(tmp_path)
    record.update(seed=42, best_by="val_qa_accuracy", config={"dataset": "repliqa_sample"})
    record.save()
    assert {k: read_result(tmp_path)[k] for k in ("seed", "best_by", "config")} == {
        "seed": 42, "best_by": "val_qa_accuracy", "config": {"dataset": "repliqa_sample"}}


def online_inbox(run, documents: int):
    """A run folder whose inbox holds ``documents`` recorded documents d0, d1, ... (a fact each: the offline writer's
    questions need one), and the config of a dataset=inbox run on it with reward=qa."""
    from summrl import inbox

    recorder = inbox.Recorder(run)
    for i in range(documents):
        recorder.record(f"d{i}", f"The council met on day {i + 10} and approved item {i + 20}.", 1)
    return recorder, compose_config(["experiment=local", "dataset=inbox", "reward=qa", f"run.dir={run}",
                                     "run.name=online", f"dataset.questions.cache_dir={run / 'q'}"])


def test_an_inbox_run_writes_questions_only_for_documents_it_has_not_trained_on(tmp_path):
    """With reward=qa every online run wrote, and paid for, the questions of every document ever recorded, those its
    checkpoints had trained on included."""
    from summrl import inbox
    from summrl.splits import load_inbox
    from summrl.storage import model_dir

    _, config = online_inbox(tmp_path, 10)
    inbox.mark(tmp_path, 3, 8, 4)  # step 3 trained d4-d7
    (model_dir(config) / "checkpoints" / "0003").mkdir(parents=True)
    splits = asyncio.run(load_inbox(config))
    assert sorted(splits.record["questions"]["per_document"]) == ["d0", "d1", "d2", "d3", "d8", "d9"]
    assert [d.id for d in splits.train] == ["d8", "d9"] and all(d.questions for d in splits.train)
    online = inbox.online(tmp_path, 3, splits.train, splits.lines, {d.id for d in splits.val}, 4)
    assert [d.id for d, _ in online.new] == ["d8", "d9"]
    # a checkpoint restored from S3 after the read resumes later: the documents between are still there
    shutil.rmtree(model_dir(config) / "checkpoints" / "0003")
    assert [d.id for d in asyncio.run(load_inbox(config)).train] == [f"d{i}" for i in range(4, 10)]


def test_an_inbox_val_line_emptied_after_online_learning_began_pulls_no_trained_document_into_val(tmp_path):
    """The refusal of a bad inbox line says to empty it and keep it; a val line emptied so (a secret scrubbed) made
    the next recorded document, one already trained on, a val document."""
    from summrl import inbox
    from summrl.splits import load_inbox

    recorder, config = online_inbox(tmp_path, 8)
    splits = asyncio.run(load_inbox(config))
    online = inbox.online(tmp_path, 0, splits.train, splits.lines, {d.id for d in splits.val}, 4)
    online.before_step(online.batches(0, 2)[0])  # step 1 trains d4, d5
    assert inbox.val_lines(tmp_path) == [0, 1, 2, 3]
    lines = recorder.path.read_bytes().split(b"\n")
    lines[1] = b""
    recorder.path.write_bytes(b"\n".join(lines))
    splits = asyncio.run(load_inbox(config))
    assert [d.id for d in splits.val] == ["d0", "d2", "d3"]
    assert [d.id for d, _ in inbox.online(tmp_path, 1, splits.train, splits.lines, set(), 4).new] == ["d6", "d7"]


def test_an_entry_a_failed_online_step_left_is_dropped_by_the_next_run_whatever_it_trains_on(tmp_path):
    """An online step marks its entry before it trains. When it failed, a run of the same folder on other data
    (allowed: the failed one recorded nothing) trained that step, and the next dataset=inbox run read the entry as
    consumed and skipped its documents."""
    from summrl import inbox
    from summrl.errors import ConfigError
    from summrl.job import RunRecord
    from summrl.loop import train

    _, config = online_inbox(tmp_path, 8)
    inbox.mark(tmp_path, 1, 6, 4)  # the failed online step 1: d4, d5
    with pytest.raises(ConfigError, match="algorithm.kl_penalty_reference_step=5"):  # refused once the step is known
        asyncio.run(train(compose_config(["experiment=local", f"run.dir={tmp_path}", "run.name=online",
                                          "algorithm=grpo_kl", "algorithm.kl_penalty_reference_step=5"]),
                          RunRecord(tmp_path)))
    assert inbox.watermark(tmp_path) == {}
    splits = asyncio.run(load(config))
    assert [d.id for d, _ in inbox.online(tmp_path, 1, splits.train, splits.lines, set(), 4).new][:2] == ["d4", "d5"]
    inbox.mark(tmp_path, 1, 6, 4)
    (tmp_path / "inbox" / "watermark.json").write_bytes(b"{")  # unreadable: a run on other data goes on
    inbox.forget_after(tmp_path, 0)
    assert (tmp_path / "inbox" / "watermark.json").read_bytes() == b"{"


def test_an_inbox_run_keeps_what_the_runs_questions_cost_before(tmp_path):
    """result.json's dataset.questions.cost_usd lost the earlier invocations' spend at every dataset=inbox run, and
    a run that waited for documents lost what its own first read had paid."""
    from summrl.job import RunRecord, read_result, write_result
    from summrl.loop import carry_question_cost, train
    from summrl.splits import Splits

    write_result(tmp_path, {"status": "completed", "run_name": "online", "steps": 3, "best_by": "val_reward",
                            "val_history": [{"step": 3, "val_reward": 0.5}],
                            "dataset": {"kind": "inbox", "questions": {"cost_usd": 0.25}}})
    _, config = online_inbox(tmp_path, 4)  # the val set only: nothing to train
    assert asyncio.run(train(config, RunRecord(tmp_path))) is None
    assert read_result(tmp_path)["dataset"]["questions"]["cost_usd"] == 0.25
    first, again = (Splits([], [], {"questions": {"cost_usd": usd}}) for usd in (0.5, 0.0))
    assert carry_question_cost(again, first).record["questions"]["cost_usd"] == 0.5


def test_an_online_run_waits_for_documents_and_a_signal_while_it_waits_leaves_the_run_as_it_was(tmp_path):
    """trainer.wait_for_documents_s: with fewer new documents than trainer.min_new_documents, the run reads the inbox
    again until they come. A SIGTERM while it waited marked the run interrupted and said to resume, though that
    invocation trained nothing (known since stop 65)."""
    import os
    import signal
    import time

    from summrl import inbox
    from summrl.job import read_result, write_result
    from summrl.loop import online_documents

    run = tmp_path / "run"
    earlier = {"status": "completed", "run_name": "online", "steps": 3, "best_by": "val_reward", "wall_s": 9.0,
               "val_history": [{"step": 3, "val_reward": 0.5}]}
    write_result(run, earlier)
    recorder = inbox.Recorder(run)
    for i in range(4):  # the online val set: nothing new to train
        recorder.record(f"d{i}", f"The council met on day {i + 10} and approved item {i + 20}.", 1)
    args = ["experiment=local", "dataset=inbox", "reward=ruler", "run.name=online", "trainer.wait_for_documents_s=120",
            f"dataset.questions.cache_dir={tmp_path / 'q'}"]

    async def wait_then_record():
        config = compose_config([*args, f"run.dir={run}"])
        waiting = asyncio.ensure_future(online_documents(config, await load(config)))
        await asyncio.sleep(1)
        recorder.record("d4", "The council met on day 14 and approved item 24.", 1)  # served while it waits
        return await waiting

    started = time.monotonic()
    _, online = asyncio.run(wait_then_record())
    assert [d.id for d, _ in online.new] == ["d4"] and time.monotonic() - started < 30

    process = subprocess.Popen([sys.executable, "-m", "summrl.train", *args, "trainer.min_new_documents=2",
                                f"hydra.run.dir={run}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in process.stdout:
        if "waiting up to" in line:
            assert "1 new document(s), fewer than trainer.min_new_documents=2" in line
            process.send_signal(signal.SIGTERM)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "summrl: interrupted: stopped while waiting for inbox documents (SIGTERM): nothing was trained, and "
        "result.json is as the run's last invocation left it; run the same command to wait again")
    saved = read_result(run)
    assert {k: saved[k] for k in earlier if k != "val_history"} == {k: v for k, v in earlier.items()
                                                                    if k != "val_history"}
    assert "error_kind" not in saved and "exit_code" not in saved and saved["val_history"] == earlier["val_history"]


def test_inbox_ids_stay_apart_when_a_clients_id_looks_like_a_renamed_one(tmp_path):
    """A second text under a used id is renamed <id>~<line>; a client had already sent that name as its own id, so
    two documents shared it, and the trained one came back as new past the watermark."""
    from summrl import inbox
    from summrl.splits import load_inbox

    recorder = inbox.Recorder(tmp_path)
    texts = {"v1": "The council met on Monday with 12 members.", "v2": "The harbor opened in May with 14 boats.",
             "x~5": "The school hired a cook for 35 pupils.", "y": "The bridge was painted blue in 1998.",
             "x": "The mayor spoke at noon to 60 people."}
    for doc_id, text in texts.items():
        recorder.record(doc_id, text, 1)
    recorder.record("x", "The library closed early on 23 June.", 1)  # line 5: the id x taken, so x~5, which a client sent
    config = compose_config(["experiment=local", "dataset=inbox", "reward=ruler", f"run.dir={tmp_path}",
                             "dataset.val_size=2", f"dataset.questions.cache_dir={tmp_path / 'q'}"])
    splits = asyncio.run(load_inbox(config))
    ids = [d.id for d in splits.train]
    assert ids == ["x~5", "y", "x", "x~5~5"]
    assert [splits.lines[i] for i in ids] == [2, 3, 4, 5]
    found = inbox.online(tmp_path, 0, splits.train, splits.lines, {d.id for d in splits.val}, 2)
    assert [d.text for d, _ in found.new] == [texts["x~5"], texts["y"], texts["x"], "The library closed early on 23 June."]


def test_the_online_val_set_is_the_first_documents_recorded_whatever_the_length_limit(tmp_path):
    """Val was counted after the limit skipped a document: the next one took its place, and a limit changed between
    online runs moved a document already trained on into val."""
    from summrl import inbox
    from summrl.data.split import DataError
    from summrl.splits import load_inbox

    recorder = inbox.Recorder(tmp_path)
    recorder.record("long", " ".join(["The harbor budget grew by 12 percent again."] * 40), 1)
    for i in range(1, 7):
        recorder.record(f"d{i}", f"The council met on day {i + 10} and approved item {i + 20}.", 1)

    def split(*overrides: str) -> tuple[list[str], list[str]]:
        config = compose_config(["experiment=local", "dataset=inbox", "reward=ruler", f"run.dir={tmp_path}",
                                 f"dataset.questions.cache_dir={tmp_path / 'q'}", *overrides])
        splits = asyncio.run(load_inbox(config))
        return [d.id for d in splits.val], [d.id for d in splits.train]

    assert split("dataset.max_document_tokens=null") == (["long", "d1", "d2", "d3"], ["d4", "d5", "d6"])
    assert split("dataset.max_document_tokens=60") == (["d1", "d2", "d3"], ["d4", "d5", "d6"])  # d4 was val
    with pytest.raises(DataError, match=r"the first 1 recorded documents, are all over dataset.max_document_tokens=60"):
        split("dataset.max_document_tokens=60", "dataset.val_size=1")


def test_an_inbox_documents_line_is_found_whatever_its_id_holds():
    from summrl.data import Document
    from summrl.splits import source_lines

    lines = {"memo#party": 0, "memo": 1, "long": 2}
    documents = [Document(id=i, topic="", text="t", questions=()) for i in ("memo#party", "memo", "long#part1",
                                                                            "long#part2")]
    assert source_lines(documents, lines) == {"memo#party": 0, "memo": 1, "long#part1": 2, "long#part2": 2}


def test_the_parts_of_a_split_inbox_document_train_in_one_step():
    """The watermark counts whole inbox lines: a document's second part left to the next step was skipped by a run
    resumed after a crash between the two steps."""
    from summrl import inbox

    new = [("a", 3), ("b#part1", 4), ("b#part2", 4), ("b#part3", 4), ("c", 5), ("d", 6)]
    batches = inbox.Online(Path("."), new, 3, 4).batches(2, 2)
    assert [(b.step, b.items, b.consumed) for b in batches] == [
        (2, ["a", "b#part1", "b#part2", "b#part3"], 5), (3, ["c", "d"], 7)]


def test_a_long_documents_parts_stay_on_one_side_of_the_split():
    """The parts were shuffled one by one: for about half the seeds a document had parts in both val and train."""
    from types import SimpleNamespace

    from summrl.data import Document
    from summrl.data.documents import Loaded
    from summrl.splits import split_whole

    documents = [Document(id=f"d{i}", topic="", text=f"text {i}", questions=()) for i in range(20)]
    documents[7:8] = [Document(id=f"memo#part{k}", topic="", text=f"part {k}", questions=()) for k in (1, 2, 3)]
    for seed in range(100):
        dataset = SimpleNamespace(train_size="all", val_size=0.2, seed=seed, name="documents")
        val, train = split_whole(Loaded("docs", documents), dataset)
        in_val = {d.id for d in val if d.id.startswith("memo")}
        assert in_val in (set(), {"memo#part1", "memo#part2", "memo#part3"}), (seed, in_val)
        assert sorted(d.id for d in val + train) == sorted(d.id for d in documents)
    # without parts, the split is the one every recorded result was made with
    plain = [d for d in documents if not d.id.startswith("memo")]
    dataset = SimpleNamespace(train_size="all", val_size=0.2, seed=80, name="documents")
    from summrl.data import split

    assert split_whole(Loaded("docs", plain), dataset) == split(plain, dataset, "docs")


def test_an_id_that_names_a_part_is_refused_before_splitting(tmp_path):
    from summrl.data import DataError
    from summrl.data.documents import limit_length, read

    table = tmp_path / "docs.jsonl"
    table.write_text(json.dumps({"id": "memo#part1", "text": "A short memo."}) + "\n"
                     + json.dumps({"id": "memo", "text": "A long memo. " * 50}) + "\n")
    dataset = compose_config(["experiment=local", "dataset=documents", f"dataset.path={table}"]).dataset
    with pytest.raises(DataError, match=r"^document memo#part1: an id may not end in #part<k>"):
        limit_length(read(dataset), dataset, lambda text: len(text.split()))


def paid(client, usd: float) -> None:
    """A priced call, accounted as JudgeClient.account does: the client's total and the caller's own."""
    from summrl.judges.client import REQUEST_COST

    client.usage.cost_usd += usd
    if REQUEST_COST.get() is not None:
        REQUEST_COST.get()[0] += usd


def paid_bank(monkeypatch, client, write, estimate_usd: float):
    """A question bank whose ``write`` pays through ``client``, for 10 uncached documents estimated at
    ``estimate_usd`` in all."""
    from types import SimpleNamespace

    import summrl.splits as splits
    from summrl.data import Document

    bank = SimpleNamespace(writer=SimpleNamespace(client=client), cached=lambda d: None, get=write, hits=0,
                           failures={}, written=0)
    documents = [Document(id=f"d{i}", topic="", text="t", questions=()) for i in range(10)]
    price = f"${estimate_usd:.2f}"
    estimate = SimpleNamespace(usd=estimate_usd, calls=2 * len(documents), local=False, line=lambda: price,
                               price=lambda: price)
    monkeypatch.setattr(splits, "plan", lambda bank, documents, model: (list(documents), estimate))
    return bank, documents


def test_the_question_budget_holds_while_writing_when_the_estimate_was_short(monkeypatch):
    """Every document passed the budget check as they all started at once: an estimate of $5 against a budget of
    $5, at a real $1 a document, spent $10 without a word."""
    from types import SimpleNamespace

    import summrl.splits as splits

    client = SimpleNamespace(model="gpt-4o-mini", usage=SimpleNamespace(cost_usd=0.0), max_concurrency=4)

    async def write(document):
        await asyncio.sleep(0.01)
        paid(client, 1.0)
        return f"questions of {document.id}"

    bank, documents = paid_bank(monkeypatch, client, write, estimate_usd=5.0)
    with pytest.raises(splits.QuestionsNotConfirmed, match=r"max_cost_usd=5 reached \(\$5\.0000 spent\): 5 documents"):
        asyncio.run(splits.fill(bank, documents, SimpleNamespace(max_cost_usd=5.0, confirm=False)))
    assert client.usage.cost_usd == 5.0


def test_a_budget_the_writing_fits_in_writes_every_document(monkeypatch):
    """A document's two calls ($0.50 each): the mean per document was the total over the documents done, which
    counted the first calls of those in flight, so 10 documents at $1 against $10 stopped with 3 unwritten."""
    from types import SimpleNamespace

    import summrl.splits as splits

    client = SimpleNamespace(model="gpt-4o-mini", usage=SimpleNamespace(cost_usd=0.0), max_concurrency=4)

    async def write(document):  # the questions, then their check
        paid(client, 0.5)
        await asyncio.sleep(0.02)
        paid(client, 0.5)
        await asyncio.sleep(0.01 * int(document.id[1:]))  # finishing at different times
        return f"questions of {document.id}"

    bank, documents = paid_bank(monkeypatch, client, write, estimate_usd=10.0)
    checked = asyncio.run(splits.fill(bank, documents, SimpleNamespace(max_cost_usd=10.0, confirm=False)))
    assert len(checked) == 10 and client.usage.cost_usd == 10.0


def test_retried_question_calls_stay_within_the_question_budget(tmp_path):
    """A document's calls were held to dataset.questions.max_cost_usd only as it started, not as it retried: with
    every reply of the wrong shape (one question of 5, and as many words as 5), the documents in flight retried each
    call 5 times and spent 1.67 times the budget. Each call, a retry too, now needs the room for it."""
    from summrl.splits import plan, question_bank

    wrong = json.dumps({"questions": [{"question": "What? " * 120, "answer": "This. " * 120}]})
    with FakeLLM() as server:
        server.script.extend(Reply(wrong) for _ in range(200))
        paid = ["judge=openai_compatible", "judge.model=gpt-4o-mini", f"judge.api_base={server.base_url}",
                "judge.retry_base_s=0", "dataset.questions.confirm=false"]
        config = config_for(FIXTURE, tmp_path, *paid)
        budget = plan(question_bank(config), read(config.dataset).documents, "gpt-4o-mini")[1].usd  # the estimate
        with pytest.raises(QuestionsNotConfirmed, match=rf"max_cost_usd={budget:g} reached") as stopped:
            asyncio.run(load(config_for(FIXTURE, tmp_path, *paid, f"dataset.questions.max_cost_usd={budget}")))
        assert len(server.requests) > 8  # retried: past the first call of each document in flight
    assert 0 < stopped.value.questions_cost_usd <= budget


def test_a_table_that_is_not_utf8_or_holds_half_a_character_is_one_line_naming_it(tmp_path):
    """Both were tracebacks (UnicodeDecodeError, UnicodeEncodeError), which the CLI shows as a bug."""
    from summrl.data import DataError
    from summrl.data.documents import _table_rows
    from summrl.data.repliqa import _read_rows

    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps({"text": "fine"}).encode() + b"\n" + '{"text": "caf\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(DataError, match=r"latin.jsonl, line 2: not UTF-8 \(byte 0xe9 at offset \d+\)"):
        _table_rows(latin)
    half = tmp_path / "half.jsonl"
    half.write_text('{"text": "an emoji cut \\ud83d short"}\n')
    with pytest.raises(DataError, match=r"half.jsonl, line 1: a \\u escape of half a character"):
        _table_rows(half)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "saved by Notepad"}).encode() + b"\n")
    assert _table_rows(bom)[0] == [{"text": "saved by Notepad"}]
    (tmp_path / "bad.jsonl").write_bytes(b'{"document_id": "a"\n')
    with pytest.raises(DataError, match=r"bad.jsonl, line 1: not JSON \("):
        _read_rows(tmp_path / "bad.jsonl")
    (tmp_path / "latin.csv").write_bytes("text\nfine\ncaf\xe9\n".encode("latin-1"))  # a pandas traceback's words
    with pytest.raises(DataError, match=r"latin.csv, line 3: not UTF-8 \(byte 0xe9 .*: re-save it as UTF-8"):
        _table_rows(tmp_path / "latin.csv")
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbftext,id\r\nsaved by Excel,a\r\n")
    assert _table_rows(tmp_path / "excel.csv")[0] == [{"text": "saved by Excel", "id": "a"}]
    # UTF-16 (Notepad's "Unicode", PowerShell 5's >): a .txt was "a binary file", a table "not UTF-8 (byte 0xff)"
    (tmp_path / "wide.jsonl").write_bytes(json.dumps({"text": "wide"}).encode("utf-16"))
    with pytest.raises(DataError, match=r"wide.jsonl: UTF-16 text .*iconv -f utf-16 -t utf-8"):
        _table_rows(tmp_path / "wide.jsonl")
    (tmp_path / "wide").mkdir()
    (tmp_path / "wide" / "notes.txt").write_bytes("Minutes of the meeting.".encode("utf-16"))
    with pytest.raises(DataError, match=r"^notes.txt: UTF-16 text"):
        read(dataset(tmp_path / "wide"))
    # with no byte-order mark (it was "a binary file ... save its text as .txt"), and UTF-32 (it was "UTF-16")
    for encoding, said in (("utf-16-le", "UTF-16 text (every other byte is 0; no byte-order mark), not UTF-8: re-save "
                                         "it as UTF-8, e.g. iconv -f utf-16le -t utf-8"),
                           ("utf-16-be", "e.g. iconv -f utf-16be -t utf-8"),
                           ("utf-32", "UTF-32 text (its first bytes say so), not UTF-8: re-save it as UTF-8, e.g. "
                                      "iconv -f utf-32 -t utf-8")):
        (tmp_path / "wide" / "notes.txt").write_bytes("Minutes of the meeting.".encode(encoding))
        with pytest.raises(DataError, match=re.escape(said)):
            read(dataset(tmp_path / "wide"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"bad.parquet: can't be read as \.parquet \("):
        _read_rows(tmp_path / "bad.parquet")


def test_text_with_no_space_to_cut_at_is_cut_between_characters_within_the_limit():
    """Chinese text (。 and no spaces) or a URL stayed one part, over the limit: "split into 1 parts"."""
    chinese = "今天市政府宣布新的交通计划。" * 40
    count = len  # a token per character
    parts = split_text(chinese, 100, count)
    assert len(parts) == 6 and all(count(p) <= 100 for p in parts) and "".join(parts) == chinese
    url = "https://example.com/" + "a" * 300
    parts = split_text(f"See {url} now.", 100, count)
    assert all(count(p) <= 100 for p in parts) and "".join(parts).replace(" ", "") == f"See{url}now."


def test_a_number_where_the_text_should_be_is_named_with_its_type_and_the_fix(tmp_path):
    """{"text": 12345} was reported as "no text in column 'text'", as if the cell were empty."""
    import pandas as pd

    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "text": "Alice went to Paris."}\n{"id": "b", "text": 12345}\n')
    with pytest.raises(DataError, match=r"rows.jsonl, line 2: column 'text' \(dataset.text_field\) holds an int "
                                        r"\(12345\), not text: make it a string$"):
        read(dataset(path))
    table = tmp_path / "rows.parquet"
    pd.DataFrame({"id": ["a", "b"], "text": [1.5, 2.0]}).to_parquet(table)
    with pytest.raises(DataError, match=r"rows.parquet, row 1: column 'text' \(dataset.text_field\) holds a float "
                                        r"\(1.5\), not text: make it a string$"):
        read(dataset(table))
    path.write_text('{"id": "a", "text": ["a list"]}\n')
    with pytest.raises(DataError, match=r"line 1: column 'text' \(dataset.text_field\) holds a list \(\[\"a list\"\]\)"):
        read(dataset(path))
    # an id of another type was taken as its Python text ("['a']", "True") where a text cell of it is refused; a
    # number stays an id (found by an audit)
    for cell, name in (('["a"]', "a list"), ('{"k": 1}', "a dict"), ("true", "a bool")):
        path.write_text('{"id": %s, "text": "Alice went to Paris."}\n' % cell)
        with pytest.raises(DataError, match=rf"line 1: column 'id' \(dataset.id_field\) holds {name} .*not text"):
            read(dataset(path))
    path.write_text('{"id": 7, "text": "Alice went to Paris."}\n')
    assert [d.id for d in read(dataset(path)).documents] == ["7"]
    # Repliqa's files by any case of their suffix, as dataset=documents reads them
    from summrl.data.repliqa import _read_rows

    upper = tmp_path / "rows.JSONL"
    upper.write_text(path.read_text())
    with pytest.raises(DataError, match=r"missing column"):  # read as .jsonl; it was "unsupported file type '.JSONL'"
        _read_rows(upper)


def test_rows_are_numbered_as_the_file_counts_them_in_every_message(tmp_path):
    """Row errors counted from 0 ("row 1" for a .jsonl file's second line) while not-JSON and not-UTF-8 named the
    line from 1, and the duplicate-id message pointed at "row 0"."""
    import pandas as pd

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "text": "Alice went to Paris."}\n\n{"id": "b", "text": ""}\n')  # a blank line
    with pytest.raises(DataError, match=r"rows.jsonl, line 3: no text in column 'text'"):
        read(dataset(rows))
    rows.write_text('{"id": "a", "text": "Alice went to Paris."}\n{"id": "a", "text": "Carol flew to Rome."}\n')
    with pytest.raises(DataError, match=r"rows.jsonl, line 2: id 'a' is already line 1's: ids in column 'id' must"):
        read(dataset(rows))
    table = tmp_path / "rows.csv"
    table.write_text('id,text\na,"Alice went\nto Paris."\na,Carol flew to Rome.\n')  # a cell over two lines
    with pytest.raises(DataError, match=r"rows.csv, data row 2: id 'a' is already data row 1's"):
        read(dataset(table))
    table = tmp_path / "rows.parquet"
    pd.DataFrame({"id": ["a", "b"], "text": ["Alice went to Paris.", " "]}).to_parquet(table)
    with pytest.raises(DataError, match=r"rows.parquet, row 2: no text in column 'text'"):
        read(dataset(table))


def _old_word_runs(sentence, limit, count_tokens):
    """The word runs as split_text cut them before it searched for each cut (a count per word: quadratic)."""
    runs, chunk = [], []
    for word in sentence.split(" "):
        if chunk and count_tokens(" ".join([*chunk, word])) > limit:
            runs.append(" ".join(chunk))
            chunk = []
        chunk.append(word)
    runs.append(" ".join(chunk))
    return runs


def subwords(text: str) -> int:
    """A stand-in tokenizer with words of several tokens: up to 3 letters or digits a token, punctuation apart."""
    return len(re.findall(r"\w{1,3}|[^\w\s]", text))


def budgeted(text: str, count_tokens):
    """``count_tokens``, failing once all its calls together have counted 40 times ``text``'s characters: linear work,
    not quadratic."""
    counted = 0

    def count(piece: str) -> int:
        nonlocal counted
        counted += len(piece)
        if counted > 40 * len(text):
            raise AssertionError(f"counted {counted} characters of a {len(text)}-character text: quadratic")
        return count_tokens(piece)
    return count


def test_a_long_line_with_no_sentence_end_splits_in_linear_work_within_the_limit():
    """Each word re-counted the whole run so far: 20,000 words took 62 s, 200,000 did not finish in 120 s."""
    text = " ".join(f"w{i % 977}" for i in range(200_000))
    parts = split_text(text, 500, budgeted(text, words))
    assert len(parts) == 400 and all(words(p) <= 500 for p in parts)
    assert " ".join(parts) == text  # every word, in order


@pytest.mark.parametrize("counter", [words, subwords])
def test_documents_split_as_before_the_faster_cut(monkeypatch, counter):
    """The recorded runs depend on where documents are cut: the search for each cut finds the same cuts as adding a
    word at a time did, for paragraphs, sentences and long sentences (empty words from double spaces included)."""
    import random

    from summrl.data import documents

    rng = random.Random(7)
    vocab = ["the", "cat", "internationalization", "2020", "42.5", "e.g.", "(see", "it)", "", "don't", "naïve"]
    text = "\n\n".join(" ".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 300))) + "."
                                 for _ in range(rng.randint(1, 5))) for _ in range(8))
    for limit in (3, 17, 60, 250):
        new = split_text(text, limit, counter)
        with monkeypatch.context() as patched:
            patched.setattr(documents, "_word_runs", _old_word_runs, raising=False)
            assert new == split_text(text, limit, counter), limit
        for _ in range(20):
            sentence = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 400)))
            if counter(sentence) > limit:
                assert documents._word_runs(sentence, limit, counter) == _old_word_runs(sentence, limit, counter)


def test_offline_questions_checked_at_another_min_recall_are_cached_apart():
    from summrl.judges.questions import OFFLINE_WRITER, OfflineQuestionWriter

    assert OfflineQuestionWriter().writer == OFFLINE_WRITER  # the caches written so far stay valid
    assert OfflineQuestionWriter(min_recall=1.0).writer != OFFLINE_WRITER  # their verdicts differ: not reused


def _old_between_characters(run, limit, count_tokens):
    """The cuts between characters before each was searched for near the last (a binary search over the whole rest)."""
    out = []
    while (tokens := count_tokens(run)) > limit and len(run) > 1:
        low, high = 1, len(run) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if count_tokens(run[:middle]) <= limit:
                low = middle
            else:
                high = middle - 1
        out.append((run[:low], count_tokens(run[:low])))
        run = run[low:]
    return out + [(run, tokens)]


def test_a_long_run_with_no_space_is_cut_as_before_in_linear_work():
    """A 200,000-character run with no space (a URL, Chinese text) at a limit of 500 counted 411 times its characters
    (82 M with a real tokenizer): each cut's search tokenized halves of the whole rest. The cuts are the same."""
    import random

    from summrl.data.documents import _between_characters

    text = "今天市政府宣布新的交通计划。" * 14_286
    cuts = _between_characters(text, 500, budgeted(text, len))
    assert [len(c) for c, _ in cuts] == [500] * 400 + [4] and "".join(c for c, _ in cuts) == text
    rng = random.Random(11)
    for counter in (len, subwords):
        for _ in range(40):
            run = "".join(rng.choice("ab1-.,中文") for _ in range(rng.randint(1, 900)))
            for limit in (1, 2, 7, 50, 300):
                assert _between_characters(run, limit, counter) == _old_between_characters(run, limit, counter)


def test_another_length_limit_moves_no_other_document_between_val_and_train(tmp_path):
    """The split was drawn after long_documents=skip dropped documents: another limit reshuffled the rest, so
    documents one run trained on were the next run's val."""
    from summrl.splits import split_whole

    for i in range(20):
        (tmp_path / f"doc{i:02d}.txt").write_text(f"Document {i} about topic {i}. " + "filler words. " * (60 if i == 7
                                                                                                        else 3))
    sides = {}
    for mode, limit in (("skip", 1000), ("skip", 100), ("split", 100)):
        config = dataset(tmp_path, val_size=0.2, long_documents=mode, max_document_tokens=limit)
        val, train = split_whole(limit_length(read(config), config, words), config)
        sides[mode, limit] = ({d.id.split("#")[0] for d in val}, {d.id.split("#")[0] for d in train})
    assert sides["skip", 100][0] | {"doc07.txt"} >= sides["skip", 1000][0] >= sides["skip", 100][0]
    assert sides["split", 100] == sides["skip", 1000]  # parts on their document's side
    assert not sides["skip", 100][0] & sides["skip", 1000][1]  # nothing trained on in one is val in the other


def test_table_and_folder_input_a_user_saves_is_read_whole(tmp_path):
    """Found by an audit: each of these lost text silently, or refused a valid file."""
    # a CSV row with an unquoted comma: pandas took the first column as the index and shifted every cell left
    table = tmp_path / "notes.csv"
    table.write_text("id,text\na,Alpha Corp earned 12 million in 2023, and its CEO is Ada Park.\nb,Fine text.\n")
    with pytest.raises(DataError, match=r"notes.csv, line 2: 3 fields, the header has 2 \(id, text\): a cell holding "
                                        r"a comma must be quoted"):
        read(dataset(table))
    table.write_text('id,text\na,"Alpha Corp earned 12 million in 2023, and its CEO is Ada Park."\n')
    assert [d.text for d in read(dataset(table)).documents] == [
        "Alpha Corp earned 12 million in 2023, and its CEO is Ada Park."]
    # a quote left open: the rows after it were read as its cell's text, 5 rows as 3 documents without a word
    table.write_text('id,text\n1,Ann runs the depot.\n2,"Carol opened it.\n3,Bob moved.\n4,"Dana in Austin."\n'
                     '5,Eve left.\n')
    with pytest.raises(DataError, match=r"notes.csv: the row from line 3 is not valid CSV \(',' expected after '\"'\): "
                                        r"a quoted cell ends with a quote"):
        read(dataset(table))
    # a cell over the csv module's 128 KB default (a long document, what long_documents=split is for): a traceback
    long = " ".join(f"Sentence {i} of the long report." for i in range(6000))
    table.write_text(f'id,text\nlong,"{long}"\nb,Fine text.\n')
    assert [len(d.text) for d in read(dataset(table)).documents] == [len(long), len("Fine text.")]
    # JSON writers leave U+2028, U+2029 and U+0085 unescaped in strings: splitlines cut the line there
    lines = tmp_path / "notes.jsonl"
    lines.write_text(json.dumps({"id": "a", "text": "One\u2028two\u2029three\x85four."}, ensure_ascii=False) + "\n",
                     encoding="utf-8")
    assert [d.text for d in read(dataset(lines)).documents] == ["One\u2028two\u2029three\x85four."]

    folder = tmp_path / "site"
    (folder / "archive" / "2024").mkdir(parents=True)
    # </head> left out (valid HTML): html.parser put the body inside <head>, which was dropped whole
    (folder / "page.html").write_text("<html><head><title>Report</title><body><p>The depot opened in 2021.</p>"
                                      "<pre>def f():\n    return 1</pre></body></html>")
    (folder / "archive" / "2024" / "q1.md").write_text("Q1 revenue was 12 million.")
    # a hidden link to a real folder marked it read: its documents were left out, as hidden
    (folder / ".latest").symlink_to(folder / "archive" / "2024")
    # a damaged PDF raised pypdf's AttributeError: a traceback instead of the one-line error
    loaded = read(dataset(folder))
    assert [d.id for d in loaded.documents] == ["archive/2024/q1.md", "page.html"]
    assert loaded.documents[1].text == "The depot opened in 2021.\n\ndef f():\n    return 1"  # <pre> keeps its indent
    assert dict(loaded.skipped_files) == {".latest": "hidden"}
    (folder / "damaged.pdf").write_bytes(minimal_pdf("Damaged.").replace(b"trailer\n<<", b"trailer\n-1"))
    with pytest.raises(DataError, match=r"damaged.pdf: not a readable PDF \(AttributeError"):
        read(dataset(folder))


def test_a_repliqa_json_tables_empty_cells_are_empty_not_nan(tmp_path):
    """pandas reads a .json table's nulls as NaN, which became the text "nan": every null question_id was one id
    ("question_id nan is also row 1's"), and a null topic was the topic "nan"."""
    from summrl.config import RepliqaDatasetConfig
    from summrl.data.repliqa import all_documents

    rows = [{"document_id": f"d{i}", "document_topic": "News" if i == 0 else None, "document_path": "",
             "document_extracted": f"Document {i}.", "question_id": None, "question": f"Question {k}?", "answer": "A",
             "long_answer": None} for i in range(3) for k in range(2)]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    documents = all_documents(RepliqaDatasetConfig(files=[str(tmp_path / "r.json")], train_size=2, val_size=1))
    assert [(d.id, d.topic) for d in documents] == [("d0", "News"), ("d1", ""), ("d2", "")]
    assert [(q.id, q.long_answer) for q in documents[1].questions] == [("d1-q1", ""), ("d1-q2", "")]


def test_a_document_with_no_question_a_summary_must_answer_is_left_out_and_named(tmp_path, caplog):
    """The offline writer finds no name, number or date in it and writes only an unanswerable question: any summary,
    an empty one too, answered every question, so its QA reward was 1.0 whatever the policy wrote (found by an
    audit)."""
    import logging
    import shutil

    from summrl.splits import load

    folder = tmp_path / "documents"
    shutil.copytree(ROOT / "tests" / "fixtures" / "documents", folder)
    (folder / "team-values.txt").write_text("This note is about how we like to work together as a team.\n"
                                            "we try to be kind and to listen to each other before we decide.\n")
    caplog.set_level(logging.INFO, logger="summrl")
    config = compose_config(["experiment=local", "dataset=documents", f"dataset.path={folder}", "dataset.val_size=2",
                             f"dataset.questions.cache_dir={tmp_path / 'questions'}"])
    splits = asyncio.run(load(config))
    kept = {d.id for d in [*splits.val, *splits.train]}
    assert "team-values.txt" not in kept and len(kept) == 10
    assert all(any(q.answerable for q in d.questions) for d in [*splits.val, *splits.train])
    assert ("1 document(s) left out, none of their questions that a summary must answer passed the check: "
            "team-values.txt") in caplog.text


@pytest.mark.parametrize("stop, code, named", [("SIGINT", 130, "Ctrl-C or SIGINT"), ("SIGTERM", 143, "SIGTERM")])
def test_a_signal_while_prepare_writes_questions_is_one_line_with_the_signals_exit_code(tmp_path, stop, code, named):
    """It was asyncio's CancelledError and KeyboardInterrupt tracebacks, exit 1, with no word that what was written is
    cached (found by an audit). SIGTERM killed it at once, and so did Ctrl-C where a script had started it in the
    background (`cmd &`: the shell has it ignore Ctrl-C), as this one is: prepare ran on, and paid, to the end."""
    import os
    import signal
    import time

    with FakeLLM(default_delay_s=1.0) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "summrl.data", "prepare", "experiment=local", "dataset=documents",
             f"dataset.path={FIXTURE}", "judge=openai_compatible", "judge.model=gpt-4o-mini",
             f"judge.api_base={server.base_url}", "dataset.questions.confirm=false",
             f"dataset.questions.cache_dir={tmp_path / 'questions'}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as `cmd &` starts it
        deadline = time.monotonic() + 120
        while not server.requests:  # writing: the judge has been asked
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(getattr(signal, stop))
        out, err = process.communicate(timeout=120)
    assert process.returncode == code and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"summrl: interrupted: stopped ({named}); the questions and rubrics "
                                            "written so far are cached: the same command writes only the rest")


def test_train_documents_all_skipped_for_length_are_named_so_not_as_a_question_check(tmp_path):
    """"after the question check, 1 val and 0 train documents are left", where no question was dropped: the one train
    document was over dataset.max_document_tokens and skipped (found by an audit)."""
    from summrl.data import DataError
    from summrl.splits import read_documents, split_whole

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "short.md").write_text("The Orchard Street library reopened on May 3, 2025.\n")
    (folder / "huge.md").write_text("The harbor budget grew by 12 percent in 2024. " * 60)
    limits = ["dataset.val_size=1", "dataset.max_document_tokens=60", "dataset.long_documents=skip"]

    def val_ids(seed: int) -> list[str]:
        config = config_for(folder, tmp_path, *limits, f"dataset.seed={seed}")
        try:
            return [d.id for d in split_whole(read_documents(config, report=False), config.dataset)[0]]
        except DataError:  # huge.md in val: that side has its own message
            return []

    seed = next(seed for seed in range(50) if val_ids(seed) == ["short.md"])
    with pytest.raises(DataError, match=r"^the train documents are all over dataset.max_document_tokens=60 and "
                                        r"skipped: raise the limit"):
        asyncio.run(load(config_for(folder, tmp_path, *limits, f"dataset.seed={seed}")))

    # Every document over it: summrl.data inspect ended in a min() traceback, and prepare said "prepared 0 documents"
    # of a dataset training refuses (found by this stop's README audit)
    (folder / "short.md").write_text("The Orchard Street library reopened on May 3, 2025. " * 20)
    for command in ("inspect", "prepare"):
        result = subprocess.run([sys.executable, "-m", "summrl.data", command, "experiment=local", "dataset=documents",
                                 f"dataset.path={folder}", *limits], cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"summrl: config error: the documents in {folder} are all over dataset.max_document_tokens=60 and "
            "skipped: raise the limit, or set dataset.long_documents=split")


def test_question_settings_that_leave_no_answerable_question_are_refused_naming_them():
    """per_document=1 with unanswerable_share=0.6 asks for one unanswerable question a document: every document was
    left out, and the line said to add documents (found by a review)."""
    from summrl.errors import ConfigError

    docs = ["experiment=local", "dataset=documents", f"dataset.path={FIXTURE}"]
    with pytest.raises(ConfigError, match=r"^dataset.questions.unanswerable_share: 0.6 of dataset.questions."
                                          r"per_document=1 makes all 1 unanswerable"):
        compose_config([*docs, "dataset.questions.per_document=1", "dataset.questions.unanswerable_share=0.6"])
    assert compose_config([*docs, "dataset.questions.per_document=2",
                           "dataset.questions.unanswerable_share=0.4"]).dataset.questions.per_document == 2


def test_a_split_too_small_for_groups_per_step_is_refused_before_any_question_is_written(tmp_path):
    """The refusal came after the question check, which only removes documents: with an LLM judge the user had
    confirmed and paid for every document's questions first (found by an audit: 48 written, then refused)."""
    from tests.conftest import run_cli

    cache = tmp_path / "questions"
    result = run_cli(["experiment=local", "dataset=documents", f"dataset.path={ROOT / 'tests/fixtures/documents'}",
                      "judge=lexical", f"dataset.questions.cache_dir={cache}", "trainer.groups_per_step=20",
                      f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert re.search(r"trainer\.groups_per_step=20: the train split has \d+ document\(s\)", result.stderr)
    assert "written" not in result.stderr and not (cache.exists() and any(cache.iterdir()))


def test_an_inbox_whose_val_documents_get_no_questions_names_a_fix_that_applies_to_an_inbox(tmp_path):
    """It said to add documents or change dataset.val_size: an inbox's val set is its first recorded documents, which
    neither changes (the watermark refuses another val size) (found by this stop's inbox audit)."""
    from summrl import inbox
    from summrl.errors import ConfigError
    from summrl.splits import load_inbox

    recorder = inbox.Recorder(tmp_path)
    for i in range(6):  # nothing the offline question writer can ask about
        recorder.record(f"d{i}", "hello there, and welcome", 1)
        recorder.record(f"e{i}", f"hello there, and welcome {'again ' * (i + 1)}", 1)
    config = compose_config(["experiment=local", "dataset=inbox", "reward=qa", f"run.dir={tmp_path}",
                             f"dataset.questions.cache_dir={tmp_path / 'q'}"])
    with pytest.raises(ConfigError, match=r"after the question check, 0 val and \d+ train documents are left: another "
                                          r"judge or dataset.questions settings .* move .*inbox aside"):
        asyncio.run(load_inbox(config))
