"""Repliqa grouping and splitting on a schema-exact parquet fixture; the shipped sample; bad data."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from summrl.config import RepliqaDatasetConfig
from summrl.data import REPLIQA_COLUMNS, UNANSWERABLE, DataError, load_splits
from tests.conftest import SAMPLE, compose_config, repliqa_rows


def splits(path, train_size, val_size, seed=80):
    return load_splits(RepliqaDatasetConfig(name="fixture", files=[str(path)], seed=seed,
                                     train_size=train_size, val_size=val_size))


def test_rows_group_into_documents_with_their_questions(repliqa_parquet):
    val, train = splits(repliqa_parquet(20), train_size=15, val_size=5)
    assert len(val) == 5 and len(train) == 15
    assert {d.id for d in val}.isdisjoint({d.id for d in train})
    for doc in val + train:
        assert len(doc.questions) == 5
        assert [q.id for q in doc.questions] == [f"{doc.id}-q{i}" for i in range(1, 6)]
        assert sum(not q.answerable for q in doc.questions) == 1
        assert doc.text.startswith("Document ")


def test_split_is_a_seeded_shuffle(repliqa_parquet):
    path = repliqa_parquet(30)
    first = splits(path, 20, 10)
    again = splits(path, 20, 10)
    other = splits(path, 20, 10, seed=1)
    assert [d.id for d in first[0]] == [d.id for d in again[0]]
    assert [d.id for d in first[0]] != [d.id for d in other[0]]
    # val is the head of the shuffle and train the next documents, so growing train keeps val fixed
    assert [d.id for d in splits(path, 5, 10)[0]] == [d.id for d in first[0]]


def test_too_many_requested_documents_reports_the_available_count(repliqa_parquet):
    with pytest.raises(DataError, match="only 12 documents are available"):
        splits(repliqa_parquet(12), train_size=10, val_size=5)
    # within the documents, but a side gets none: it read "= 0 + 1 documents, but only 1 documents are available"
    from summrl.data import split_counts

    with pytest.raises(DataError, match=r"^docs: train_size \+ val_size = all \+ 0.1 = 0 \+ 1 documents leaves train "
                                        r"no document of the 1 available; each split needs at least one"):
        split_counts(1, "all", 0.1, "docs")
    with pytest.raises(DataError, match=r"= 0 \+ 15 documents, but only 10 documents are available"):  # val over n
        split_counts(10, "all", 15, "docs")


def test_train_and_val_size_come_from_the_environment(monkeypatch, repliqa_parquet):
    monkeypatch.setenv("TRAIN_SIZE", "7")
    monkeypatch.setenv("VAL_SIZE", "3")
    config = compose_config(["experiment=local", "dataset=repliqa", f"dataset.files=[{repliqa_parquet(20)}]"])
    assert (config.dataset.train_size, config.dataset.val_size) == (7, 3)
    val, train = splits(config.dataset.files[0], config.dataset.train_size, config.dataset.val_size)
    assert (len(train), len(val)) == (7, 3)
    # the command line still wins over the environment
    config = compose_config(["experiment=local", "dataset=repliqa", "dataset.train_size=4"])
    assert config.dataset.train_size == 4


def test_repliqa_defaults_without_environment(monkeypatch):
    monkeypatch.delenv("TRAIN_SIZE", raising=False)
    monkeypatch.delenv("VAL_SIZE", raising=False)
    config = compose_config(["experiment=local", "dataset=repliqa"])
    assert (config.dataset.train_size, config.dataset.val_size) == (3500, 91)
    assert (config.dataset.hf_path, config.dataset.hf_split) == ("ServiceNow/repliqa", "repliqa_0")


def test_jsonl_files_read_like_parquet(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in repliqa_rows(6)))
    val, train = splits(path, 4, 2)
    assert len(val) + len(train) == 6


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda rows: [{k: v for k, v in r.items() if k != "question"} for r in rows], "missing column(s) question"),
        (lambda rows: [dict(r, document_extracted="  ") if i == 7 else r for i, r in enumerate(rows)], "row 8 (document doc00001): empty document_extracted: give the row its document text or remove it"),
        (lambda rows: [dict(r, question="") if i == 3 else r for i, r in enumerate(rows)], "row 4 (document doc00000): empty question"),
        (lambda rows: [dict(r, answer=None) if i == 12 else r for i, r in enumerate(rows)], "row 13 (document doc00002): empty answer"),
    ],
)
def test_bad_data_names_the_file_and_row(repliqa_parquet, mutate, message):
    path = repliqa_parquet(rows=mutate(repliqa_rows(4)))
    with pytest.raises(DataError) as e:
        splits(path, 2, 1)
    assert str(path) in str(e.value) and message in str(e.value)


def test_a_number_for_the_document_text_is_named_with_its_type_and_the_fix(tmp_path):
    """document_extracted=12345 was reported as "empty document_extracted", with no fix."""
    rows = repliqa_rows(2, questions_per_doc=2)
    rows[2]["document_extracted"] = 12345
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"rows.jsonl, line 3 \(document doc00001\): document_extracted holds an int "
                                        r"\(12345\), not text: make it a string$"):
        splits(path, 1, 1)
    rows[2]["document_extracted"] = ""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"line 3 \(document doc00001\): empty document_extracted: give the row its "
                                        "document text or remove it$"):
        splits(path, 1, 1)


def test_a_bad_jsonl_line_is_named_by_its_number_and_an_empty_file_is_empty(tmp_path, repliqa_parquet):
    """pandas read the file whole: a bad line was "can't be read as .jsonl (ValueError: Unexpected character found
    ...)" with no line, and an empty file was "missing column(s) document_id, ..."."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in repliqa_rows(2)) + "not json here\n")
    with pytest.raises(DataError, match=r"rows.jsonl, line 11: not JSON \(Expecting value\): each line must be one "
                                        "JSON object"):
        splits(path, 1, 1)
    path.write_text("")
    with pytest.raises(DataError, match=r"rows.jsonl: no rows; Repliqa's schema is a row per question"):
        splits(path, 1, 1)
    with pytest.raises(DataError, match=r"repliqa_0.parquet: no rows"):
        splits(repliqa_parquet(rows=[]), 1, 1)
    # a row's place in the messages about other rows is its line, in the same convention
    rows = repliqa_rows(1, questions_per_doc=2)
    rows[1]["question_id"] = rows[0]["question_id"]
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl, line 3 \(document doc00000\): question_id doc00000-q1 is also "
                                        "line 1's"):
        splits(path, 1, 1)


def test_missing_file_and_unknown_type(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        splits(tmp_path / "absent.parquet", 1, 1)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="use .parquet or .jsonl"):
        splits(tmp_path / "x.csv", 1, 1)


def test_shipped_sample_is_repliqa_shaped():
    frame = pd.read_json(SAMPLE, lines=True, dtype=False)
    assert list(frame.columns) == list(REPLIQA_COLUMNS)
    config = compose_config(["experiment=local"])
    val, train = load_splits(config.dataset)
    docs = val + train
    assert (len(val), len(train)) == (8, 32)
    assert len({d.id for d in docs}) == 40
    for doc in docs:
        assert 200 <= len(doc.text.split()) <= 400, doc.id
        assert len(doc.questions) == 5
        for q in doc.questions:
            if q.answerable:
                assert q.long_answer in doc.text  # the answer is in the document
            else:
                assert q.answer == UNANSWERABLE
    unanswerable = sum(not q.answerable for d in docs for q in d.questions) / (5 * len(docs))
    assert 0.15 <= unanswerable <= 0.25
    assert len({d.topic for d in docs}) >= 10


def test_a_repeated_question_id_is_refused_and_a_document_whose_rows_disagree_is_named(caplog):
    """One file listed twice in dataset.files counted every question twice; a row with another text for the same
    document had its question asked of the first row's text, silently."""
    import logging

    from summrl.data import DataError
    from summrl.data.repliqa import group_documents

    def row(doc, qid, text="The text."):
        return {"document_id": doc, "document_topic": "t", "document_extracted": text, "question_id": qid,
                "question": "Q?", "answer": "A", "long_answer": ""}

    with pytest.raises(DataError, match=r"^f, row 3 \(document a\): question_id q1 is also row 1's; list each file once"):
        group_documents([row("a", "q1"), row("a", "q2"), row("a", "q1")], "f")
    with caplog.at_level(logging.WARNING, logger="summrl"):
        (document,) = group_documents([row("a", "q1"), row("a", "q2", text="Another text.")], "f")
    assert document.text == "The text." and len(document.questions) == 2
    assert "f, row 2 (document a): document_extracted differs from row 1's" in caplog.text


def test_a_bad_size_from_the_environment_names_the_variable(monkeypatch):
    from summrl.errors import ConfigError

    monkeypatch.setenv("TRAIN_SIZE", "abc")  # it said "dataset.train_size ... got 'abc'", which no command line held
    with pytest.raises(ConfigError, match=r"^dataset.train_size: .*got 'abc' \(from the environment variable "
                                          r"TRAIN_SIZE='abc'\)$"):
        compose_config(["dataset=repliqa"])
    with pytest.raises(ConfigError, match=r"got 'xyz'$"):  # given on the command line: no variable named
        compose_config(["dataset=repliqa", "dataset.train_size=xyz"])


def test_the_hub_out_of_reach_is_a_network_error_naming_the_host_not_a_config_error(tmp_path, monkeypatch):
    """With no network, dataset=repliqa failed as a config error (exit 2) whose cause read "RuntimeError: Cannot send a
    request, as the client has been closed": datasets' retries drop the connection error (found by this stop's README
    audit). With HF_HUB_OFFLINE set, the real load_dataset, in the real entry point: exit 5."""
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "-m", "summrl.train", "experiment=local", "dataset=repliqa",
                             "dataset.train_size=4", "dataset.val_size=2", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 5, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "summrl: network error: could not load ServiceNow/repliqa split repliqa_0: HF_HUB_OFFLINE is set, so "
        "huggingface.co is not asked: unset it, or download it once and set dataset.files=[path/to/repliqa_0.parquet]")

    from huggingface_hub import constants

    from summrl.data.repliqa import hub_unreachable

    def no_name(host, port, *args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", no_name)
    assert hub_unreachable() == ("can't reach huggingface.co (Name or service not known): check the network "
                                 "connection (or HTTPS_PROXY)")
