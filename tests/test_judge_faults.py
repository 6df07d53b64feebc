"""`python -m summrl.train` against a loopback judge that fails: 429s, 500s, hangs, non-JSON, wrong item counts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from summrl.errors import KINDS
from summrl.perf import fault_run
from tests.conftest import repliqa_rows


def history(run_dir) -> list[dict]:
    path = run_dir / "art" / "summrl" / "models" / "faults" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_judge_failing_30_percent_of_calls_costs_retries_not_the_run(tmp_path, tiny_weights):
    """One-line documents (as in the 90% run below): the policy reads short prompts; this is a test of the judge."""
    data = tmp_path / "short_documents.parquet"
    pd.DataFrame(repliqa_rows(12)).to_parquet(data)
    run = fault_run(0.3, seed=1, run_dir=tmp_path, overrides=[tiny_weights, f"dataset.files=[{data}]",
                                                                 "dataset.train_size=8"])
    assert run["returncode"] == 0, run["stderr"][-3000:]
    result, outcomes = run["result"], run["judge_outcomes"]
    assert result["status"] == "completed" and result["steps"] == 2
    faults = sum(n for kind, n in outcomes.items() if kind != "ok")
    assert faults > 0.15 * sum(outcomes.values())  # the judge really failed that often
    assert result["judge_retries"] >= faults - result["rollouts"]["missing"]
    rollouts = result["rollouts"]
    assert rollouts["scored"] + rollouts["missing"] == 2 * (2 * 4) + 2 * (2 * 2)  # 2 steps, 2 val passes
    assert rollouts["scored"] / (rollouts["scored"] + rollouts["missing"]) >= 0.95
    # No reward is made up: a rollout without one is absent from the logged trajectories, every logged one was graded.
    logged = pd.concat(pd.read_parquet(p) for p in (tmp_path / "art" / "summrl" / "models" / "faults" / "trajectories")
                       .rglob("*.parquet"))
    assert len(logged) == rollouts["scored"]
    rows = history(tmp_path)
    failed = sum(r.get("train/judge/failed_rollouts", 0) + r.get("val/judge/failed_rollouts", 0) for r in rows)
    assert failed == rollouts["missing"]


@pytest.mark.slow
def test_a_judge_failing_90_percent_of_calls_stops_the_run_saying_why(tmp_path, tiny_weights):
    """At the run's default retries (judge.max_retries=5) and missing-reward limit (more than 20% of a window of 64
    rollouts, i.e. 13 missing). Only the scale differs from the 30% run: its first step ends with 12 rollouts (4 val +
    8 train), too few to be past the limit, so 4 documents a step instead (20 rollouts by the end of step 1), and
    one-line documents, so that the CPU policy reads short prompts (this is a test of the judge, not of generation)."""
    data = tmp_path / "short_documents.parquet"
    pd.DataFrame(repliqa_rows(12)).to_parquet(data)
    run = fault_run(0.9, seed=1, run_dir=tmp_path / "run", overrides=[
        tiny_weights, "judge.timeout_s=0.5", "trainer.groups_per_step=4", "trainer.max_steps=4", f"dataset.files=[{data}]", "dataset.train_size=8",
        "dataset.val_size=2"])
    stderr, result = run["stderr"], run["result"]
    assert run["returncode"] == KINDS["judge"][0] == 4, stderr[-3000:]
    assert "Traceback" not in stderr
    for noise in ("Give Feedback", "LiteLLM completion()"):  # litellm's, after each failed call and at each call
        assert noise not in run["stdout"] + stderr
    line = stderr.strip().splitlines()[-1]  # the last thing the run says, in one line
    assert line.startswith("summrl: judge error: ") and "rollouts have no reward" in line
    assert "trainer.max_missing_reward_rate=0.2 of trainer.missing_reward_window=64" in line
    assert line.count("openai/fake-judge") == 1 and "To fix: " in line
    # result.json records why, and the counts
    assert result["status"] == "failed" and (result["error_kind"], result["exit_code"]) == ("judge", 4)
    assert line.removeprefix("summrl: judge error: ") in result["error"]
    rollouts = result["rollouts"]
    assert rollouts["missing"] > 0.2 * 64 and sum(rollouts["missing_by_error"].values()) == rollouts["missing"]
    for kind, n in rollouts["missing_by_error"].items():
        assert f"{kind} x" in line  # counted by kind in the message too (over its window)
    assert rollouts["scored"] + rollouts["missing"] <= 4 + 16 + 16  # val, step 1, step 2 at most
    assert result["judge_calls"] > 0 and result["judge_retries"] > 0
    # it stopped within two steps: at most one step was trained and logged
    trained = [r for r in history(tmp_path / "run") if "train/judge/failed_rollouts" in r]
    assert len(trained) <= 1 and "summrl: step 2 " not in run["stdout"]


def test_perf_faults_says_a_training_run_failed_and_exits_non_zero(monkeypatch, capsys):
    """Found by an audit: a run that failed (here, refused at composition) gave a JSON of null figures and exit 0."""
    from summrl import perf

    monkeypatch.setattr(perf, "FAULT_RUN_OVERRIDES", [*perf.FAULT_RUN_OVERRIDES, "trainer.max_steps=abc"])
    with pytest.raises(SystemExit) as stop:
        perf.main(["faults"])
    assert stop.value.code == 1
    out, err = capsys.readouterr()
    figures = json.loads(out)
    assert [run["returncode"] for run in figures.values()] == [2, 2]
    assert all("trainer.max_steps" in run["stderr_tail"] for run in figures.values())
    assert "a training run failed" in err


@pytest.mark.parametrize("args", [["faults", "--rate", "-1"], ["faults", "--rate", "5"], ["faults", "--rate", "nan"],
                                  ["faults", "--rate", "0"], ["judge", "--delay", "-2"]])
def test_perf_refuses_a_rate_or_delay_that_measures_nothing_before_it_runs(args, capsys):
    """--rate -1 (or 5) ran two full training runs whose comparison meant nothing (found by an audit)."""
    from summrl import perf

    with pytest.raises(SystemExit) as stop:
        perf.main(args)
    assert stop.value.code == 2
    assert f"argument {args[1]}: must be" in capsys.readouterr().err


def test_perf_sft_takes_the_longest_slices_that_fit_its_max_tokens():
    """Found by an audit: slices started at 60 words, so a --max-tokens past about 170 changed nothing."""
    from summrl.perf import longest_fit

    assert longest_fit(lambda cut: cut <= 137, 1000) == 135  # past the old 60
    assert longest_fit(lambda cut: cut <= 42, 1000) == 40
    assert longest_fit(lambda cut: True, 23) == 20  # half the document at most
    assert longest_fit(lambda cut: cut <= 3, 1000) is None  # not even 5 words: the benchmark says so
