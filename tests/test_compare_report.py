"""summrl.report's uncertainty: CI bands and the paired table, against hand-computed values on written sweeps."""

from __future__ import annotations

import math
import subprocess
import sys

import pandas as pd
import pytest

from summrl.job import write_result
from tests.conftest import ROOT

# configuration -> seed -> the last val pass's per-document QA accuracy (the step-0 pass is 0.3 everywhere)
TWO_SEEDS = {
    "reward=qa": {"1": {"a": 0.4, "b": 0.6}, "2": {"a": 0.2, "b": 0.5}},
    # differences from qa, rows = seeds, columns = documents: [[+0.1, +0.3], [+0.2, +0.2]]
    "reward=length_penalized": {"1": {"a": 0.5, "b": 0.9}, "2": {"a": 0.4, "b": 0.7}},
    # [[+0.1, -0.1], [+0.2, -0.2]]
    "reward=ruler": {"1": {"a": 0.5, "b": 0.5}, "2": {"a": 0.4, "b": 0.3}},
}
BASE = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.4, "e": 0.2}
ONE_SEED = {
    "reward=qa": {"1": BASE},
    # differences +0.2 +0.2 +0.4 +0.2 0.0
    "reward=length_penalized": {"1": {"a": 0.4, "b": 0.6, "c": 1.0, "d": 0.6, "e": 0.2}},
    # differences +0.2 -0.2 0.0 +0.2 -0.2
    "reward=ruler": {"1": {"a": 0.4, "b": 0.2, "c": 0.6, "d": 0.6, "e": 0.0}},
}
# Seed 1 gains 0.2 on every one of 8 documents, seed 2 gains nothing: pooled as 16 independent pairs this would read
# "better" (CI [0.055, 0.145]); the training seeds disagree, which is what the CI must show.
EIGHT = {d: 0.4 for d in "abcdefgh"}
SEEDS_DISAGREE = {
    "reward=qa": {"1": EIGHT, "2": EIGHT},
    "reward=length_penalized": {"1": {d: 0.6 for d in EIGHT}, "2": EIGHT},
}


def entry(step: int, docs: dict[str, float]) -> dict:
    """A val pass; each document's hallucination rate is 1 - its QA accuracy (lower is better)."""
    mean = sum(docs.values()) / len(docs)
    return {"step": step, "val_reward": mean, "val_qa_accuracy": mean, "val_hallucination_rate": 1 - mean,
            "per_doc": {d: {"n": 2, "reward": v, "qa_accuracy": v, "hallucination_rate": 1 - v} for d, v in docs.items()}}


def write_sweep(sweep, final: dict) -> None:
    num = 0
    for configuration, seeds in final.items():
        for seed, docs in seeds.items():
            history = [entry(0, {d: 0.3 for d in docs}), entry(2, docs)]
            write_result(sweep / str(num), {
                "status": "completed", "overrides": ["experiment=local", configuration, f"seed={seed}"],
                "choices": {"reward": configuration.split("=")[1], "algorithm": "grpo"},
                "seed": int(seed), "steps": 2, "val_history": history,
                "best_val_score": max(h["val_reward"] for h in history), "final_val_score": history[-1]["val_reward"],
                "best_val_qa_accuracy": max(h["val_qa_accuracy"] for h in history),
                "final_val_qa_accuracy": history[-1]["val_qa_accuracy"]})
            num += 1


def report(sweep, out, baseline: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "summrl.report", str(sweep), "--out", str(out),
                           "--baseline", baseline], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture
def sweep(tmp_path):
    write_sweep(tmp_path / "sweep", TWO_SEEDS)
    return tmp_path / "sweep"


def test_one_seed_paired_t_over_documents_matches_hand_computed_values(tmp_path):
    write_sweep(tmp_path / "sweep", ONE_SEED)
    done = report(tmp_path / "sweep", tmp_path / "out", "reward=qa")
    assert done.returncode == 0, done.stderr
    paired = pd.read_csv(tmp_path / "out" / "paired.csv").query("metric == 'qa_accuracy'").set_index("configuration")
    # +0.2 +0.2 +0.4 +0.2 0.0: mean 0.2, sd sqrt(0.08/4) = 0.141421, se 0.0632456; t(0.975, 4) = 2.776445 -> half
    # width 0.175598; 80% power at 4 df needs a noncentrality of 3.761060 -> min detectable 3.761060 * se = 0.237870
    # (the (t.975 + t.8) * se shortcut said 0.235110)
    # t = 3.162 at 4 df: p = 0.03411, and ruler's is 1; Holm over the 2 arms: 2 x 0.03411 = 0.06822, no verdict
    better = paired.loc["reward=length_penalized"]
    assert (better.seeds, better.documents, better.verdict) == (1, 5, "no detectable difference")
    assert better.p_holm == pytest.approx(0.06822, abs=1e-4) and "not after Holm's adjustment for the 2" in better.note
    assert (better.difference, better.ci_low, better.ci_high) == pytest.approx((0.2, 0.024402, 0.375598), abs=1e-5)
    assert better.min_detectable == pytest.approx(0.237870, abs=1e-5)
    assert "one seed" in better.note and "val_size" in better.noise
    # +0.2 -0.2 0 +0.2 -0.2: mean 0, sd 0.2, se 0.0894427 -> half width 2.776445 * se = 0.248332
    same = paired.loc["reward=ruler"]
    assert same.verdict == "no detectable difference"
    assert (same.difference, same.ci_low, same.ci_high) == pytest.approx((0.0, -0.248332, 0.248332), abs=1e-5)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Difference from the baseline" in text and "no detectable difference" in text
    # The hallucination rate is paired too, and lower is better: -0.2 with CI [-0.376, -0.024] would read "better"
    # alone, and is adjusted as the score is.
    side = pd.read_csv(tmp_path / "out" / "paired.csv").query("metric == 'hallucination_rate'").set_index("configuration")
    invents_less = side.loc["reward=length_penalized"]
    assert (invents_less.difference, invents_less.ci_low, invents_less.ci_high) == pytest.approx(
        (-0.2, -0.375598, -0.024402), abs=1e-5)
    assert invents_less.verdict == "no detectable difference" and "val hallucination rate" in text
    write_sweep(tmp_path / "alone", {k: v for k, v in ONE_SEED.items() if k != "reward=ruler"})
    assert report(tmp_path / "alone", tmp_path / "alone_out", "reward=qa").returncode == 0
    alone = pd.read_csv(tmp_path / "alone_out" / "paired.csv").set_index("metric")
    assert alone.verdict.tolist() == ["better", "better"] and alone.p_holm.tolist() == pytest.approx([0.03411] * 2,
                                                                                                     abs=1e-4)


def test_seeds_by_documents_ci_matches_a_hand_computed_two_way_anova(sweep, tmp_path):
    assert report(sweep, tmp_path / "out", "reward=qa").returncode == 0
    paired = pd.read_csv(tmp_path / "out" / "paired.csv").query("metric == 'qa_accuracy'").set_index("configuration")
    # [[.1, .3], [.2, .2]]: grand mean .2; seed means .2 .2 -> MS_seed 0; document means .15 .25 -> MS_doc 2 * .005
    # = .01; residuals +-.05 -> MS_res .04 / 1 = .01. Neither component exceeds MS_res: Var = MS_res / 4 = .0025,
    # se .05, df 1, t(0.975, 1) = 12.706205 -> half width 0.635310. (The pooled t over 4 pairs said "better".)
    lp = paired.loc["reward=length_penalized"]
    assert (lp.seeds, lp.documents, lp.verdict) == (2, 2, "no detectable difference")
    assert (lp.difference, lp.ci_low, lp.ci_high) == pytest.approx((0.2, -0.435310, 0.835310), abs=1e-5)
    # [[.1, -.1], [.2, -.2]]: MS_seed 0, raised to MS_res; document means .15 -.15 -> MS_doc 2 * .045 = .09;
    # residuals +-.05 -> MS_res .01; the document component counts: Var = (MS_res + MS_doc - MS_res) / 4 = .0225,
    # se .15; Satterthwaite's df .0225^2 / (.0025^2/1 + .0225^2/1 + .0025^2/1) = 0.975904 -> half width 2.020816
    ruler = paired.loc["reward=ruler"]
    assert (ruler.difference, ruler.ci_low, ruler.ci_high) == pytest.approx((0.0, -2.020816, 2.020816), abs=1e-5)
    assert ruler.verdict == "no detectable difference" and ruler.noise.endswith("2 seeds leave the CI 1.0 degrees of "
                                                                                 "freedom: add seeds first")

    unknown = report(sweep, tmp_path / "refused", "reward=nope")
    assert unknown.returncode == 2 and "reward=nope" in unknown.stderr and "reward=qa" in unknown.stderr
    assert not (tmp_path / "refused").exists()  # refused before anything was written


def test_two_seeds_whose_means_agree_by_chance_keep_the_seeds_degrees_of_freedom():
    """The seed component, estimated negative, was dropped, and the CI took the residual's (S-1)(D-1) degrees of
    freedom: with 2 seeds it then held the true difference 60% of the time in simulation (89% over all)."""
    import numpy as np

    from summrl.compare import paired

    # row means .15 .15 -> MS_seed 0, below MS_res: raised to it, with the seeds' 1 df. Column means .15 .05 .15 .25
    # -> MS_doc 2 * .02 / 3 = .013333; residuals +-.05 -> MS_res .02 / 3 = .006667. Var = (.006667 + .013333 -
    # .006667) / 8 = .001667, se .040825; df = Var^2 / ((.006667/8)^2/1 + (.013333/8)^2/3 + (.006667/8)^2/3) = 1.5;
    # t(.975, 1.5) = 6.016663 -> half width .245629. (Before: df 3, CI [.020, .280], "better".)
    result = paired(np.array([[0.2, 0.0, 0.1, 0.3], [0.1, 0.1, 0.2, 0.2]]))
    assert result.df == pytest.approx(1.5) and result.se == pytest.approx(0.040825, abs=1e-6)
    assert (result.low, result.high) == pytest.approx((0.15 - 0.245629, 0.15 + 0.245629), abs=1e-5)
    assert result.verdict() == "no detectable difference"
    assert sum(result.shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("df", [1, 2, 4, 23])
def test_a_true_difference_of_min_detectable_is_found_80_percent_of_the_time(df):
    """What the column promises, simulated: paired t-tests over df + 1 differences whose true mean is the
    min_detectable of their true standard error reject 80% of the time. The (t.975 + t.8) * se shortcut it replaced
    gave 73% at 1 degree of freedom and 77% at 2."""
    import numpy as np
    from scipy import stats

    from summrl.compare import Paired

    n, sd = df + 1, 0.2
    se = sd / np.sqrt(n)
    delta = Paired(0.0, 0.0, 0.0, 1, n, se, df).min_detectable
    draws = np.random.default_rng(df).normal(delta, sd, size=(400_000, n))
    t = draws.mean(axis=1) / (draws.std(axis=1, ddof=1) / np.sqrt(n))
    power = float(np.mean(np.abs(t) > stats.t.ppf(0.975, df)))
    assert power == pytest.approx(0.8, abs=0.004)  # the draws' own spread: 0.0006


def test_training_seeds_that_disagree_are_not_pooled_into_a_verdict(tmp_path):
    write_sweep(tmp_path / "sweep", SEEDS_DISAGREE)
    assert report(tmp_path / "sweep", tmp_path / "out", "reward=qa").returncode == 0
    (row,) = pd.read_csv(tmp_path / "out" / "paired.csv").query("metric == 'qa_accuracy'").itertuples()
    # seed means .2 and 0 -> MS_seed 8 * .02 = .16, MS_doc = MS_res = 0: Var = .16 / 16 = .01, se .1, df 1
    assert (row.difference, row.ci_low, row.ci_high) == pytest.approx((0.1, 0.1 - 1.270621, 0.1 + 1.270621), abs=1e-5)
    assert row.verdict == "no detectable difference" and "add seeds" in row.noise


def test_the_baseline_is_matched_by_group_choice_and_unpaired_jobs_are_named(sweep, tmp_path):
    from summrl.job import read_result

    # the baseline's seed-2 job lost a document to missing rewards; the ruler arm ran an extra seed
    job = read_result(sweep / "1")
    del job["val_history"][-1]["per_doc"]["b"]
    write_result(sweep / "1", job)
    extra = read_result(sweep / "5")
    extra.update(seed=3, overrides=["experiment=local", "reward=ruler", "seed=3"])
    write_result(sweep / "6", extra)
    done = report(sweep, tmp_path / "out", "'algorithm=grpo' reward=qa")  # a choice no job overrode, quoted
    assert done.returncode == 0, done.stderr
    paired = pd.read_csv(tmp_path / "out" / "paired.csv").query("metric == 'qa_accuracy'").set_index("configuration")
    assert paired.loc["reward=length_penalized"].documents == 1
    assert "1 document(s) not scored in every job" in paired.loc["reward=length_penalized"].note
    assert "seed 3 only in this arm" in paired.loc["reward=ruler"].note


def test_a_baseline_with_no_completed_job_or_a_stray_quote_is_one_line(sweep, tmp_path):
    """The baseline's jobs all failed: exit 0 and a paired table of 0 seeds whose note ("seed 1, 2 only in this arm")
    sent the user to add seeds. A stray quote in --baseline: a ValueError traceback (found by this stop's audit)."""
    from summrl.job import read_result

    for num in (0, 1):  # reward=qa's two seeds
        write_result(sweep / str(num), {**read_result(sweep / str(num)), "status": "failed", "error": "config: ..."})
    done = report(sweep, tmp_path / "out", "reward=qa")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "summrl.report: --baseline 'reward=qa' names reward=qa, which has no completed job (its jobs: failed): nothing "
        "to compare with; rerun or resume its jobs, or name another baseline"]
    assert not (tmp_path / "out").exists()  # refused before anything is written
    done = report(sweep, tmp_path / "out", "reward='qa")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "summrl.report: --baseline \"reward='qa\": No closing quotation; write it as an override, e.g. reward=qa"]


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


def test_arms_that_scored_every_pair_alike_say_so_instead_of_a_noise_source():
    import numpy as np

    from summrl.compare import advice, paired

    same = paired(np.zeros((2, 8)))  # e.g. algorithm=grpo_kl at coefficient 0.001 beside grpo, 8 steps
    assert (same.difference, same.verdict()) == (0.0, "no detectable difference")
    assert math.isnan(same.low) and math.isnan(same.high) and math.isnan(same.min_detectable)
    # the same nonzero difference on every pair: a CI of width 0 said "better" from 3 pairs
    shifted = paired(np.full((1, 3), 0.2))
    assert shifted.verdict() == "no noise estimate" and math.isnan(shifted.low) and math.isnan(shifted.p)
    assert advice(same) == "none: every pair differs by the same amount"
    assert advice(paired(np.array([[0.1, -0.1], [-0.1, 0.1], [0.1, -0.1], [-0.1, 0.1], [0.1, -0.1]]))) == (
        "100% of the noise is sampling noise within documents: raise trainer.val_rollouts_per_doc or dataset.val_size")
    # 2 seeds: the CI's width is the seeds' 1 degree of freedom, which no val size narrows (it said raise val_size)
    assert advice(paired(np.array([[0.1, 0.3], [0.2, 0.2]]))) == (
        "100% of the noise is sampling noise within documents, but 2 seeds leave the CI 1.0 degrees of freedom: add "
        "seeds first")
    # one seed: the spread across documents holds the sampling noise within them too (it said "100% ... between
    # val documents", and named only val_size)
    assert advice(paired(np.array([[0.1, 0.3, 0.0, 0.5]]))).startswith(
        "all of the noise is between val documents and sampling within them (one seed can't tell them apart)")


def test_a_document_one_side_alone_scored_is_counted_with_one_seed():
    """With one seed the count was always 0: a document the arm scored and the baseline never did was not named."""
    from summrl.report import paired_table

    def job(scores):
        return {"val_history": [{"step": 4, "per_doc": {d: {"qa_accuracy": v} for d, v in scores.items()}}]}

    table = pd.DataFrame({"job": ["0", "1"], "seed": [1, 1], "status": ["completed"] * 2,
                          "configuration": ["reward=qa", "reward=ruler"]})
    results = {"0": job({"a": 0.2, "b": 0.4}), "1": job({"a": 0.3, "b": 0.5, "c": 0.9})}
    (row,) = paired_table(table, results, "qa_accuracy", "reward=qa").itertuples()
    assert row.documents == 2 and "1 document(s) not scored in every job" in row.note


def test_a_seed_one_side_scored_nothing_for_is_left_out_not_the_whole_comparison():
    """One seed's empty val pass emptied the documents every job scored: the row said "too few pairs to tell" over
    the other seeds' 30 good pairs, and a NaN score turned the whole row NaN."""
    from summrl.report import paired_table

    def job(scores):
        return {"val_history": [{"step": 4, "per_doc": {d: {"qa_accuracy": v} for d, v in scores.items()}}]}

    docs = "abcdefghij"
    table = pd.DataFrame({"job": [str(i) for i in range(6)], "seed": [1, 2, 3] * 2, "status": ["completed"] * 6,
                          "configuration": ["reward=qa"] * 3 + ["reward=ruler"] * 3})
    base = {d: 0.2 + 0.05 * i for i, d in enumerate(docs)}
    results = {"0": job(base), "1": job(base), "2": job(base),
               "3": job({d: v + 0.1 for d, v in base.items()}), "4": job({}),
               "5": job({**{d: v + 0.1 for d, v in base.items()}, "j": float("nan")})}
    (row,) = paired_table(table, results, "qa_accuracy", "reward=qa").itertuples()
    assert (row.seeds, row.documents) == (2, 9)  # seeds 1 and 3; document j's NaN in seed 3 is not a score
    assert row.difference == pytest.approx(0.1)
    assert "seed 2 left out: no per-document qa_accuracy on one side" in row.note
    assert "1 document(s) not scored in every job" in row.note


def test_a_pair_whose_sides_scored_different_numbers_of_summaries_is_named():
    """A document missing one of its rewards on one side was paired over other draws without a word."""
    from summrl.report import paired_table

    def job(scores, n):
        return {"val_history": [{"step": 4, "per_doc": {d: {"qa_accuracy": v, "n": n.get(d, 4)}
                                                        for d, v in scores.items()}}]}

    table = pd.DataFrame({"job": ["0", "1"], "seed": [1, 1], "status": ["completed"] * 2,
                          "configuration": ["reward=qa", "reward=ruler"]})
    results = {"0": job({"a": 0.2, "b": 0.4, "c": 0.5}, {"a": 1}), "1": job({"a": 0.3, "b": 0.5, "c": 0.4}, {})}
    (row,) = paired_table(table, results, "qa_accuracy", "reward=qa").itertuples()
    assert row.documents == 3
    assert "1 pair(s) scored from different numbers of summaries on the two sides (missing rewards)" in row.note


def test_holm_adjusts_the_arms_p_values_and_the_report_verdicts_follow_it(tmp_path):
    import numpy as np

    from summrl.compare import holm, paired
    from summrl.report import paired_table

    # hand-computed: sorted 0.01, 0.02, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.02), max(0.04, 1 x 0.04); nan is no test
    assert holm([0.04, 0.01, math.nan, 0.02]) == pytest.approx([0.04, 0.03, math.nan, 0.04], nan_ok=True)
    assert holm([0.5, 0.01]) == pytest.approx([0.5, 0.02])  # never above 1, never below a smaller p's value
    assert holm([0.9, 0.3]) == pytest.approx([0.9, 0.6])
    one = paired(np.array([[0.2, 0.2, 0.4, 0.2, 0.0]]))
    assert one.p == pytest.approx(0.03411, abs=1e-4)  # t = 0.2 / 0.0632456 = 3.162 at 4 df
    assert one.verdict() == "better" and one.verdict(p=0.0682) == "no detectable difference"

    def job(diffs):
        return {"val_history": [{"step": 4, "per_doc": {f"d{i}": {"qa_accuracy": 0.3 + v} for i, v in enumerate(diffs)}}]}

    results = {"0": job([0.0] * 5), "1": job([0.2, 0.2, 0.4, 0.2, 0.0]), "2": job([0.0, 0.1, -0.1, 0.0, 0.05]),
               "3": job([0.4, 0.4, 0.5, 0.3, 0.4])}
    table = pd.DataFrame({"job": list(results), "seed": [1] * 4, "status": ["completed"] * 4,
                          "configuration": ["base", "lucky", "null", "strong"]})
    rows = paired_table(table, results, "qa_accuracy", "base").set_index("configuration")
    # p: lucky 0.0341, strong ~0.0001, null ~0.7 -> Holm: strong x3, lucky x2 = 0.0682, null
    assert rows.loc["lucky", "p_holm"] == pytest.approx(2 * one.p)
    assert rows.loc["lucky", "ci_low"] > 0  # its own CI excludes 0 ...
    assert rows.loc["lucky", "verdict"] == "no detectable difference"  # ... but not after the adjustment
    assert "not after Holm's adjustment for the 3 arms compared" in rows.loc["lucky", "note"]
    assert rows.loc["strong", "verdict"] == "better" and rows.loc["null", "verdict"] == "no detectable difference"
    alone = paired_table(table[table.configuration.isin(["base", "lucky"])], results, "qa_accuracy", "base")
    assert alone.verdict.tolist() == ["better"] and alone.p_holm[0] == pytest.approx(one.p)


def test_an_arm_too_small_for_a_verdict_is_not_counted_in_holms_family():
    """An arm with fewer than 3 pairs can only say "too few pairs to tell", yet it counted as a test: it doubled the
    other arm's p-value and took its verdict away (found by an audit)."""
    from summrl.report import paired_table

    def job(scores):
        return {"val_history": [{"step": 4, "per_doc": {d: {"qa_accuracy": v} for d, v in scores.items()}}]}

    base = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.4, "e": 0.2}
    results = {"0": job(base), "1": job({d: v + x for (d, v), x in zip(base.items(), [0.2, 0.2, 0.4, 0.2, 0.0])}),
               "2": job({"a": 0.5, "b": 0.6})}
    table = pd.DataFrame({"job": list(results), "seed": [1] * 3, "status": ["completed"] * 3,
                          "configuration": ["base", "lucky", "tiny"]})
    rows = paired_table(table, results, "qa_accuracy", "base").set_index("configuration")
    assert rows.loc["tiny", "verdict"] == "too few pairs to tell"
    assert rows.loc["lucky", "p_holm"] == pytest.approx(0.03411, abs=1e-4)  # its own p: the one test
    assert rows.loc["lucky", "verdict"] == "better"


def test_arms_whose_val_summaries_were_drawn_at_other_temperatures_are_not_compared(tmp_path):
    """trainer.val_temperature=null draws the val summaries at trainer.temperature, so a sweep over it compared
    other decodings as though only training differed: paired, with verdicts (found by an audit)."""
    from summrl.report import paired_table

    def job(scores, temperature, val_temperature=None):
        per_doc = {d: {"qa_accuracy": v, "hallucination_rate": 1 - v} for d, v in scores.items()}
        return {"config": {"judge.kind": "lexical", "trainer.val_qa_max_chars": 3000, "trainer.val_qa_forbid_han": True,
                           "trainer.temperature": temperature, "trainer.val_temperature": val_temperature},
                "val_history": [{"step": 4, "per_doc": per_doc}]}

    base = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.4, "e": 0.2}
    better = {d: v + x for (d, v), x in zip(base.items(), [0.2, 0.2, 0.4, 0.2, 0.0])}
    table = pd.DataFrame({"job": ["0", "1"], "seed": [1, 1], "status": ["completed"] * 2,
                          "configuration": ["trainer.temperature=1.0", "trainer.temperature=0.7"]})
    for metric, lower in (("qa_accuracy", False), ("hallucination_rate", True)):
        results = {"0": job(base, 1.0), "1": job(better, 0.7)}
        (row,) = paired_table(table, results, metric, "trainer.temperature=1.0", lower).itertuples()
        assert row.verdict == "not comparable"
        assert "other settings than the baseline (trainer.val_temperature)" in row.note
        # the same val temperature set for both: one decoding, compared
        results = {"0": job(base, 1.0, 1.0), "1": job(better, 0.7, 1.0)}
        (row,) = paired_table(table, results, metric, "trainer.temperature=1.0", lower).itertuples()
        assert row.verdict == "better"


def test_arms_scored_against_other_written_questions_are_not_compared_and_other_val_sizes_are_named():
    """dataset=documents: the judge writes each document's questions, and dataset.questions.per_document (or the
    unanswerable share, or the check) writes other ones, so QA accuracy against them is on another scale; those arms
    were paired and given verdicts. And arms that drew other numbers of val summaries (trainer.val_rollouts_per_doc)
    were told their pairs were uneven from "missing rewards" (both found by an audit)."""
    from summrl.report import paired_table

    def job(scores, per_document=5, reward="qa", val_rollouts=2):
        per_doc = {d: {"qa_accuracy": v, "reward": v, "n": val_rollouts} for d, v in scores.items()}
        return {"config": {"judge.kind": "lexical", "trainer.val_qa_max_chars": 3000, "trainer.val_qa_forbid_han": True,
                           "trainer.temperature": 1.0, "reward.kind": reward,
                           "dataset.questions.per_document": per_document,
                           "dataset.questions.unanswerable_share": 0.2, "dataset.questions.check": True,
                           "trainer.val_rollouts_per_doc": val_rollouts},
                "val_history": [{"step": 4, "per_doc": per_doc}]}

    base = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.4, "e": 0.2}
    better = {d: v + x for (d, v), x in zip(base.items(), [0.2, 0.2, 0.4, 0.2, 0.0])}
    table = pd.DataFrame({"job": ["0", "1"], "seed": [1, 1], "status": ["completed"] * 2,
                          "configuration": ["base", "arm"]})
    for metric, reward, comparable in (("qa_accuracy", "qa", False), ("reward", "qa", False),
                                       ("reward", "length", True)):
        results = {"0": job(base, 5, reward), "1": job(better, 3, reward)}
        (row,) = paired_table(table, results, metric, "base").itertuples()
        assert (row.verdict == "better") is comparable, (metric, reward, row.verdict)
        assert ("other settings than the baseline (dataset.questions.per_document)" in row.note) is not comparable
    results = {"0": job(base), "1": job(better)}  # the same questions: compared
    assert paired_table(table, results, "qa_accuracy", "base").verdict.tolist() == ["better"]
    results = {"0": job(base), "1": job(better, val_rollouts=4)}
    (row,) = paired_table(table, results, "qa_accuracy", "base").itertuples()
    assert row.verdict == "better"  # more draws of the same score: paired, and the reason named
    assert ("5 pair(s) scored from different numbers of summaries on the two sides (trainer.val_rollouts_per_doc=4 "
            "here, 2 in the baseline)") in row.note and "missing rewards" not in row.note


def test_a_report_keeps_one_markdown_row_per_job_no_empty_side_table_and_no_stale_paired_csv(tmp_path):
    """Found by an audit: a failed job's multi-line error (a ValidationError) split its row of the Jobs table into
    three; with only the baseline completed, the hallucination section printed a bare table header; and a report
    without --baseline left the earlier report's paired.csv, its verdicts, beside tables it no longer matched."""
    from summrl.report import write_report

    sweep = tmp_path / "sweep"
    write_sweep(sweep, {"reward=qa": TWO_SEEDS["reward=qa"]})
    write_result(sweep / "2", {"status": "failed", "overrides": ["experiment=local", "reward=ruler", "seed=1"],
                               "seed": 1, "error": "ValidationError: 2 validation errors for Summary\nsummary\n"
                                                   "  Field required [type=missing]"})
    out = tmp_path / "out"
    write_report(sweep, out, "reward=qa")
    text = (out / "report.md").read_text()
    jobs = text.split("## Jobs\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(jobs) == 2 + 3  # header, rule, a row per job
    assert "ValidationError: 2 validation errors for Summary summary Field required [type=missing]" in jobs[-1]
    assert "No other completed configuration." in text
    assert text.count("## Difference from the baseline") == 1  # the main one: no side table with no rows
    assert (out / "paired.csv").exists()
    write_report(sweep, out)
    assert not (out / "paired.csv").exists() and "Difference from the baseline" not in (out / "report.md").read_text()


def test_summrl_compare_run_as_a_command_names_the_command_that_compares(tmp_path):
    """A library module: `python -m summrl.compare <folder>` printed nothing, wrote nothing and exited 0, so the
    comparison seemed done (a sweeps audit)."""
    result = subprocess.run([sys.executable, "-m", "summrl.compare", str(tmp_path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == ("summrl.compare is the statistics summrl.report uses: run python -m summrl.report "
                                     "<sweep folder> (--baseline '<overrides>' for the paired comparisons)")
