"""summrl.report's uncertainty: CI bands and the paired table, against hand-computed values on a written sweep."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from summrl.job import write_result
from tests.conftest import ROOT

# configuration -> seed -> the last val pass's per-document QA accuracy (the step-0 pass is 0.3 everywhere)
FINAL = {
    "reward=qa": {"1": {"a": 0.4, "b": 0.6}, "2": {"a": 0.2, "b": 0.5}},
    # differences from qa, (seed, doc) in order: +0.1 +0.3 +0.2 +0.2
    "reward=length_penalized": {"1": {"a": 0.5, "b": 0.9}, "2": {"a": 0.4, "b": 0.7}},
    # +0.1 -0.1 +0.2 -0.2
    "reward=ruler": {"1": {"a": 0.5, "b": 0.5}, "2": {"a": 0.4, "b": 0.3}},
}


def entry(step: int, docs: dict[str, float]) -> dict:
    mean = sum(docs.values()) / len(docs)
    return {"step": step, "val_reward": mean, "val_qa_accuracy": mean,
            "per_doc": {d: {"reward": v, "qa_accuracy": v} for d, v in docs.items()}}


@pytest.fixture
def sweep(tmp_path):
    sweep = tmp_path / "sweep"
    num = 0
    for configuration, seeds in FINAL.items():
        for seed, docs in seeds.items():
            history = [entry(0, {"a": 0.3, "b": 0.3}), entry(2, docs)]
            write_result(sweep / str(num), {
                "status": "completed", "overrides": ["experiment=local", configuration, f"seed={seed}"],
                "seed": int(seed), "steps": 2, "val_history": history,
                "best_val_score": max(h["val_reward"] for h in history), "final_val_score": history[-1]["val_reward"],
                "best_val_qa_accuracy": max(h["val_qa_accuracy"] for h in history),
                "final_val_qa_accuracy": history[-1]["val_qa_accuracy"]})
            num += 1
    return sweep


def test_paired_ci_and_verdicts_match_hand_computed_values(sweep, tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "summrl.report", str(sweep), "--out", str(out),
                           "--baseline", "reward=qa"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    paired = pd.read_csv(out / "paired.csv").set_index("configuration")
    # differences 0.1 0.3 0.2 0.2: mean 0.2, sd sqrt(0.02/3) = 0.0816497, se 0.0408248;
    # t(0.975, 3) = 3.182446 -> half width 0.129924; t(0.8, 3) = 0.978472 -> min detectable (3.182446 + 0.978472) * se
    better = paired.loc["reward=length_penalized"]
    assert better.pairs == 4 and better.verdict == "better"
    assert (better.difference, better.ci_low, better.ci_high) == pytest.approx((0.2, 0.070076, 0.329924), abs=1e-5)
    assert better.min_detectable == pytest.approx(0.169868, abs=1e-5)
    # differences 0.1 -0.1 0.2 -0.2: mean 0, sd sqrt(0.1/3) = 0.182574, se 0.0912871 -> half width 0.290515
    same = paired.loc["reward=ruler"]
    assert same.verdict == "no detectable difference"
    assert (same.difference, same.ci_low, same.ci_high) == pytest.approx((0.0, -0.290515, 0.290515), abs=1e-5)
    report = (out / "report.md").read_text()
    assert "Difference from the baseline" in report and "no detectable difference" in report

    unknown = subprocess.run([sys.executable, "-m", "summrl.report", str(sweep), "--baseline", "reward=nope"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert unknown.returncode != 0 and "reward=nope" in unknown.stderr and "reward=qa" in unknown.stderr


def test_curve_bands_are_over_seeds_or_over_documents(sweep, tmp_path):
    from summrl.report import collect, curve_bands, write_report

    table, curves, _, results = collect(sweep)
    bands = curve_bands({job: c["qa_accuracy"] for job, c in curves.items()}, table, results, "qa_accuracy")
    over, points = bands["reward=qa"]
    # seed means at step 2: 0.5 and 0.35 -> mean 0.425, se 0.075, t(0.975, 1) = 12.706205 -> half width 0.952965
    assert over == "2 seeds" and points[1][0] == 2
    assert (points[1][1].mean, points[1][1].low) == pytest.approx((0.425, 0.425 - 0.952965), abs=1e-5)
    table, curves, _, results = collect(sweep / "0")  # one run: over its documents, 0.4 and 0.6
    over, points = curve_bands({job: c["qa_accuracy"] for job, c in curves.items()}, table, results,
                               "qa_accuracy")["reward=qa"]
    assert over == "2 documents" and points[1][1].high == pytest.approx(0.5 + 12.706205 * 0.1, abs=1e-5)

    write_report(sweep, tmp_path / "bands")
    import matplotlib.image as mpimg

    image = mpimg.imread(tmp_path / "bands" / "val_curves.png")[..., :3]
    # the translucent band: pale tints of the line colours, neither white nor a line colour
    pale = ((image.min(axis=-1) > 0.6) & (image.max(axis=-1) < 0.98) & (image.max(axis=-1) - image.min(axis=-1) > 0.05))
    assert pale.mean() > 0.02
