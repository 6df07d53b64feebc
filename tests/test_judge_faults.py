"""`python -m summrl.train` against a loopback judge that fails: 429s, 500s, hangs, non-JSON, wrong item counts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from summrl.perf import fault_run


def history(run_dir) -> list[dict]:
    path = run_dir / "art" / "summrl" / "models" / "faults" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_judge_failing_30_percent_of_calls_costs_retries_not_the_run(tmp_path):
    run = fault_run(0.3, seed=1, run_dir=tmp_path)
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
def test_a_judge_failing_90_percent_of_calls_stops_the_run_saying_why(tmp_path):
    run = fault_run(0.9, seed=1, run_dir=tmp_path, overrides=["judge.max_retries=1", "trainer.missing_reward_window=16",
                                                               "trainer.max_steps=4"])
    assert run["returncode"] != 0
    result = run["result"]
    assert result["status"] == "failed" and result["error"].startswith("MissingRewardsError: ")
    assert "of the last" in result["error"] and "trainer.missing_reward_window=16" in result["error"]
    assert " x" in result["error"] and "judge.max_retries (now 1)" in result["error"]
    message = result["error"].removeprefix("MissingRewardsError: ")
    assert message in run["stderr"]  # said in one line
    assert result["rollouts"]["missing"] > 0.2 * 16
    trained = [r for r in history(tmp_path) if "train/judge/failed_rollouts" in r]
    assert len(trained) <= 1  # it stopped within two steps
    assert "summrl: step 2 " not in run["stdout"]
