"""The hallucination metric (summrl.facts) on hand-made summaries, and where it is reported: the benchmark table's
"% inventing" column and summrl.report's final val hallucination rate."""

from __future__ import annotations

import pandas as pd
import pytest

from summrl.data import Document, Question
from summrl.facts import hallucinates, invented_facts

DOC = Document(
    id="d1", topic="Local News",
    text="Ruth Okafor opened the Hollis Footbridge on March 14, 2024. It cost 2.1 million dollars and Dunmore "
         "Civil Works built it in 18 months.",
    questions=(Question("d1-q1", "Who opened the bridge?", "Ruth Okafor", ""),),
)
FAITHFUL = "Ruth Okafor opened the Hollis Footbridge in March 2024; it cost 2.1 million dollars."


@pytest.mark.parametrize(
    "summary,invented",
    [
        (FAITHFUL, []),
        ("The Hollis footbridge opened in 2023.", ["2023"]),  # a wrong year
        ("Mayor Ruth Okafor and Tom Reyes opened it.", ["Tom", "Reyes"]),  # an invented name
        ("It opened on a Tuesday in June.", ["Tuesday", "June"]),  # invented date words
        ("It cost 2,100,000 dollars and took 18 months.", ["2100000"]),
        ("The bridge opened. Dunmore built it; NASA helped.", ["NASA"]),  # a sentence's first word is no name
        ("**Summary:** the footbridge opened in march.", []),  # case is ignored; markup too
        # date words that are everyday English count only capitalized: "may" was an invented date (an audit)
        ("The council may vote on a toll, which could mar the opening.", []),
        ("It opened in May.", ["May"]),
        # layout is not a fact: list markers, headings, a hyphenated compound of a known name
        ("Key points:\n1. The Hollis Footbridge opened.\n2. It cost 2.1 million dollars.", []),
        ("## Overview\nOpening Ceremony\nA Hollis-based firm built it.", []),
        ("Key Points:\n1. Ruth Okafor and Tom Reyes opened it in 2023.", ["2023", "Tom", "Reyes"]),
    ],
)
def test_the_hallucination_metric_on_hand_made_summaries(summary, invented):
    assert invented_facts(summary, DOC.text) == invented
    assert hallucinates(summary, DOC.text) == bool(invented)


def test_names_in_any_script_are_facts():
    """A name was a run of ASCII letters: "Müller" was "M" + "ller", "Ángel" was "ngel" (no capital: never a name),
    and a Cyrillic or Greek name was no word at all, so inventing one went uncounted."""
    document = "Ramón Müller visitó Madrid. Иван Петров посетил Москву."
    assert invented_facts("Luego, Ramón Müller visitó Madrid.", document) == []
    assert invented_facts("Luego, Ramón Müller visitó Sevilla con Ángel.", document) == ["Sevilla", "Ángel"]
    assert invented_facts("Потом Иван Петров посетил Казань.", document) == ["Казань"]
    assert invented_facts("Потом иван петров посетил Москву.", document) == []  # case is ignored, as for Latin


INVENTING = "Ruth Okafor and Tom Reyes opened the Hollis Footbridge in 2023."  # a name and a year not in DOC


def test_the_benchmark_tables_percent_inventing_column():
    from summrl.benchmark.summary import markdown, summarize

    # the runner's rows: one per summary, hallucinated = hallucinates(summary, document)
    summaries = {"model-a": [FAITHFUL, FAITHFUL, INVENTING, FAITHFUL],  # 1 of 4 invents: 25%
                 "model-b": [INVENTING, INVENTING, FAITHFUL, INVENTING]}  # 3 of 4: 75%
    rows = pd.DataFrame([
        {"model": model, "step": None, "document_id": f"d{i % 2}", "score": 0.5, "reward": 0.5, "words": 12,
         "hallucinated": int(hallucinates(summary, DOC.text)), "model_cost_usd": 0.0, "judge_cost_usd": 0.0}
        for model, texts in summaries.items() for i, summary in enumerate(texts)])
    table = summarize(rows)
    assert dict(zip(table.model, table.hallucination_pct)) == {"model-a": 25.0, "model-b": 75.0}
    lines = {line.split("|")[1].strip(): line for line in markdown(table).splitlines() if line.startswith("| model-")}
    header = markdown(table).splitlines()[0].split("|")
    column = [c.strip() for c in header].index("% inventing")
    assert [lines[m].split("|")[column].strip() for m in ("model-a", "model-b")] == ["25.0", "75.0"]


def test_the_reports_hallucination_column(tmp_path):
    from summrl.job import write_result
    from summrl.report import write_report

    sweep = tmp_path / "sweep"
    for num, (reward, rate) in enumerate((("qa", 0.25), ("rubric", 0.0625))):
        write_result(sweep / str(num), {
            "status": "completed", "overrides": ["experiment=local", f"reward={reward}", "seed=80"], "seed": 80,
            "steps": 8, "wall_s": 60.0, "best_val_score": 0.4, "final_val_score": 0.4, "best_val_qa_accuracy": 0.4,
            "final_val_qa_accuracy": 0.4, "final_val_hallucination_rate": rate,
            "val_history": [{"step": 8, "val_reward": 0.4, "val_qa_accuracy": 0.4, "val_hallucination_rate": rate}]})
    out = tmp_path / "report"
    write_report(sweep, out)
    table = pd.read_csv(out / "summary.csv")
    assert dict(zip(table.configuration, table.final_val_hallucination_rate)) == {"reward=qa": 0.25,
                                                                                 "reward=rubric": 0.0625}
    report = (out / "report.md").read_text()
    header = next(line for line in report.splitlines() if "final_val_hallucination_rate" in line)
    column = [c.strip() for c in header.split("|")].index("final_val_hallucination_rate")
    shown = {line.split("|")[column].strip() for line in report.splitlines() if "| reward=" in line and "completed" in line}
    assert shown == {"0.250", "0.062"}
