"""summrl.report on sweep folders laid out as jobs leave them (result.json + ART's history.jsonl)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from summrl.job import write_result
from tests.conftest import ROOT

# configuration -> seed -> (val QA accuracy per step)
CURVES = {
    "reward=qa": {"80": [0.2, 0.4, 0.5], "81": [0.3, 0.3, 0.7]},
    "reward=ruler": {"80": [0.1, 0.2, 0.3], "81": [0.1, 0.4, 0.2]},
}


def write_job(job_dir: Path, overrides: list[str], seed: str, curve: list[float], status: str = "completed") -> None:
    history = job_dir / "art" / "summrl" / "models" / f"run-{job_dir.name}" / "history.jsonl"
    history.parent.mkdir(parents=True)
    with history.open("w") as f:
        for step, acc in enumerate(curve):
            f.write(json.dumps({"training_step": step, "val/reward": acc / 2, "val/qa_accuracy": acc}) + "\n")
            f.write(json.dumps({"training_step": step + 1, "train/reward": 0.5}) + "\n")
    result = {"status": status, "overrides": [*overrides, f"seed={seed}"], "seed": int(seed), "wall_s": 90.0,
              "judge_cost_usd": 0.25}
    if status == "completed":
        result.update(steps=len(curve) - 1, best_val_score=max(curve) / 2, final_val_score=curve[-1] / 2,
                      best_val_qa_accuracy=max(curve), final_val_qa_accuracy=curve[-1],
                      # the ruler arm as a judge that can't rank leaves it: no step trained a group
                      untrained_steps=list(range(1, len(curve))) if "reward=ruler" in overrides else [])
    else:
        result["error"] = "MissingRewardsError: judge down"
    write_result(job_dir, result)


@pytest.fixture
def sweep(tmp_path):
    sweep = tmp_path / "multirun" / "2026-11-22" / "05-10-00"
    num = 0
    for configuration, seeds in CURVES.items():
        for seed, curve in seeds.items():
            write_job(sweep / str(num), ["experiment=local", configuration], seed, curve)
            num += 1
    write_job(sweep / str(num), ["experiment=local", "reward=length_penalized"], "80", [0.1], status="failed")
    return sweep


def test_report_table_stats_and_plots(sweep, tmp_path):
    out = tmp_path / "report"
    priced_in_part = sweep / "3" / "result.json"  # a judge reply without token counts: its $ is unknown, not $0.25
    priced_in_part.write_text(json.dumps({**json.loads(priced_in_part.read_text()), "judge_unpriced_calls": 2.0}))
    result = subprocess.run([sys.executable, "-m", "summrl.report", str(sweep), "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out / "summary.csv")
    assert list(table.job) == [0, 1, 2, 3, 4]
    assert list(table.status) == ["completed"] * 4 + ["failed"]
    assert table.configuration.tolist()[:2] == ["reward=qa", "reward=qa"]  # seed and shared overrides left out
    assert table.loc[1, "best_val_qa_accuracy"] == 0.7 and table.loc[1, "final_val_qa_accuracy"] == 0.7
    assert table.loc[4, "error"] == "MissingRewardsError: judge down"
    assert table.minutes.tolist()[0] == 1.5 and table.judge_cost_usd.tolist()[0] == 0.25
    assert pd.isna(table.judge_cost_usd[3])
    assert table.steps_untrained.tolist()[:4] == [0, 0, 2, 2] and pd.isna(table.steps_untrained[4])

    report = (out / "report.md").read_text()
    assert "5 jobs: 4 completed, 1 failed." in report
    assert "`experiment=local`" in report  # the overrides every job shares, stated once
    # final: qa 0.5 and 0.7 -> mean 0.6, sample std 0.141; ruler 0.3 and 0.2 -> 0.25, 0.071; then the mean best
    # (qa 0.6, ruler 0.3 and 0.4 -> 0.35) out of 3 val passes each
    assert "| reward=qa       |        0.600 |       0.141 |       2 |       0.600 |            3 |" in report
    assert "| reward=ruler    |        0.250 |       0.071 |       2 |       0.350 |            3 |" in report
    assert "Warning" not in report

    import matplotlib.image as mpimg

    for name in ("val_curves.png", "final_val.png"):
        image = mpimg.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 400
        assert image[..., :3].std() > 0.05, f"{name} is blank"


def test_arms_that_differ_by_preset_alone_are_two_configurations_not_one(tmp_path):
    """experiment= is left out of a job's W&B name: a sweep over two presets was one configuration, "defaults", its
    two arms averaged as if seeds."""
    from summrl.report import by_configuration, collect

    sweep = tmp_path / "multirun"
    write_job(sweep / "0", ["experiment=local"], "1", [0.3, 0.3])
    write_job(sweep / "1", ["experiment=local_lr_high"], "1", [0.3, 0.9])
    write_job(sweep / "2", ["experiment=local_lr_high", "model.lr=1e-5"], "1", [0.3, 0.6])
    table = collect(sweep)[0]
    assert table.configuration.tolist() == ["experiment=local", "experiment=local_lr_high",
                                            "experiment=local_lr_high,model.lr=1e-5"]
    assert len(by_configuration(table, "qa_accuracy")) == 3


def test_val_curves_are_over_the_completed_seeds_at_the_steps_every_seed_has(tmp_path):
    """A failed seed's early points were averaged in, and its later steps averaged over the surviving seed alone,
    under a "2 seeds" label: the curve ended on one seed's score."""
    from summrl.report import collect, curve_bands

    sweep = tmp_path / "multirun"
    write_job(sweep / "0", ["reward=qa"], "1", [0.3, 0.4, 0.5, 0.6])
    write_job(sweep / "1", ["reward=qa"], "2", [0.3, 0.2, 0.7, 0.8])
    write_job(sweep / "2", ["reward=qa"], "3", [0.3, 0.1], status="failed")
    write_job(sweep / "3", ["reward=qa"], "4", [0.3, 0.5, 0.5])  # stopped at max_steps=2
    table, curves, _, results = collect(sweep)
    over, points = curve_bands({job: c["qa_accuracy"] for job, c in curves.items()}, table, results,
                               "qa_accuracy")["defaults"]  # reward=qa: shared, stated once
    assert over == "3 seeds" and [step for step, _ in points] == [0, 1, 2]
    assert [round(band.mean, 4) for _, band in points] == [0.3, round((0.4 + 0.2 + 0.5) / 3, 4), 0.5667]


def test_a_jobs_unreadable_result_is_said_to_be_unreadable_not_missing(sweep, tmp_path, capsys):
    """A result.json cut or edited was reported as "no result.json (job never started?)"."""
    from summrl.report import collect

    (sweep / "1" / "result.json").write_text('{"status": "comp')
    (sweep / "5").mkdir()  # a job that never started
    table = collect(sweep)[0].set_index("job")
    assert (table.loc["1", "status"], table.loc["5", "status"]) == ("unreadable", "missing")
    assert table.loc["1", "error"].startswith("result.json is not valid JSON: restore it")
    assert f"{sweep / '1' / 'result.json'} is not valid JSON" in capsys.readouterr().err



def test_jobs_a_sweep_planned_but_never_ran_and_jobs_killed_before_saving_keep_their_configuration(sweep, tmp_path):
    """A sweep stopped part-way was reported as if it had planned only the jobs that started, and a job killed before
    its first save showed as configuration "defaults" with no seed, taking the shared overrides line with it."""
    from omegaconf import OmegaConf

    from summrl.report import collect

    # Hydra's record of the sweep: 6 jobs, in this order; the fixture's 5 folders are its first 5
    OmegaConf.save({"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                          "max_batch_size": None, "params": None},
                              "overrides": {"task": ["experiment=local", "reward=qa,ruler,length_penalized",
                                                     "seed=80,81"]}}}, sweep / "multirun.yaml")
    (sweep / "1" / "result.json").unlink()  # killed (kill -9, out of memory) before its first save
    (sweep / "1" / ".hydra").mkdir()
    OmegaConf.save(["experiment=local", "reward=qa", "seed=81"], sweep / "1" / ".hydra" / "overrides.yaml")
    (sweep / "1" / "train.log").write_text("summrl: run ... | starting at step 0 of 3\n")
    table, _, common, _ = collect(sweep)
    assert common == ["experiment=local"]
    rows = table.set_index("job")[["configuration", "seed", "status"]]
    assert rows.loc["1"].tolist() == ["reward=qa", "81", "missing"]
    assert rows.loc["5"].tolist() == ["reward=length_penalized", "81", "not started"]
    assert list(table.job) == [str(n) for n in range(6)]
    error = table.set_index("job").error
    assert error["1"] == "no result.json: it started (see its train.log) and was killed before its first save"
    assert error["5"] == "the sweep stopped before this job (it has no folder)"


def test_report_on_a_single_run_folder(sweep, tmp_path):
    from summrl.report import write_report

    table = write_report(sweep / "0", tmp_path / "one")
    assert len(table) == 1 and table.loc[0, "best_val_qa_accuracy"] == 0.5
    assert (tmp_path / "one" / "val_curves.png").stat().st_size > 10_000


def test_report_names_a_folder_with_no_jobs_and_an_out_that_cant_be_a_folder(sweep, tmp_path):
    def report(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "summrl.report", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    (tmp_path / "empty").mkdir()
    empty = report(str(tmp_path / "empty"))
    assert empty.returncode == 2
    assert empty.stderr.strip() == f"summrl.report: {tmp_path / 'empty'} has no result.json and no numbered job folders"
    (tmp_path / "a-file").write_text("not a folder")
    out_a_file = report(str(sweep), "--out", str(tmp_path / "a-file"))
    assert out_a_file.returncode == 2 and "Traceback" not in out_a_file.stderr
    assert out_a_file.stderr.strip() == (f"summrl.report: --out {tmp_path / 'a-file'}: can't write a folder there "
                                         "(File exists); name a folder")


def test_report_shows_both_stages_of_an_sft_run(tmp_path):
    from summrl.report import write_report

    sweep = tmp_path / "sweep"
    write_job(sweep / "0", ["sft=none"], "80", [0.2, 0.3])
    write_job(sweep / "1", ["sft=best_of_n"], "80", [0.2, 0.35, 0.4])
    result = json.loads((sweep / "1" / "result.json").read_text())
    result["sft"] = {"kind": "best_of_n", "samples_kept": 12, "val_before": {"step": 0, "val_qa_accuracy": 0.2},
                     "val_after": {"step": 1, "val_qa_accuracy": 0.35}, "step": 1}
    write_result(sweep / "1", result)
    table = write_report(sweep, tmp_path / "out")
    assert table.sft.tolist() == ["none", "best_of_n"]
    assert table.steps.tolist() == [1, 1]  # GRPO steps: ART's step count less the SFT stage's (it had 2)
    assert table.loc[1, "val_qa_before_sft"] == 0.2 and table.loc[1, "val_qa_after_sft"] == 0.35
    assert pd.isna(table.loc[0, "val_qa_after_sft"]) and table.loc[1, "sft_samples_kept"] == 12
    assert "val_qa_after_sft" in (tmp_path / "out" / "report.md").read_text()
    # a sweep with no SFT stage keeps its table as it was
    write_report(sweep / "0", tmp_path / "plain")
    assert "val_qa_after_sft" not in (tmp_path / "plain" / "report.md").read_text()


def test_configurations_rank_by_their_final_val_not_the_best_of_more_passes(tmp_path):
    """The best of more val passes is higher by chance alone: an arm that validated 7 times ranked above one that
    validated twice and ended higher."""
    from summrl.report import by_configuration, collect

    sweep = tmp_path / "multirun"
    write_job(sweep / "0", ["model.lr=1e-5"], "1", [0.3, 0.5, 0.35, 0.5, 0.3, 0.55, 0.4])
    write_job(sweep / "1", ["model.lr=2e-5"], "1", [0.3, 0.5])
    stats = by_configuration(collect(sweep)[0], "qa_accuracy")
    assert stats.index.tolist() == ["model.lr=2e-5", "model.lr=1e-5"]
    assert stats.final_mean.tolist() == [0.5, 0.4] and stats.best_mean.tolist() == [0.5, 0.55]
    assert stats.val_passes.tolist() == ["2", "7"]


def _with_config(job_dir: Path, **config) -> None:
    result = json.loads((job_dir / "result.json").read_text())
    result["config"] = {"judge.kind": "local", "judge.min_recall": 0.6, "reward.kind": "qa", **config}
    write_result(job_dir, result)


def test_val_rewards_of_different_reward_functions_are_not_compared(tmp_path, capsys):
    """A job without val QA accuracy made the score every job's val reward: the weighted reward's and qa's were
    ranked and paired as one scale."""
    from summrl.report import write_report

    sweep = tmp_path / "multirun"
    write_job(sweep / "0", ["reward=qa"], "1", [0.2, 0.4])
    write_job(sweep / "1", ["reward=weighted"], "1", [0.2, 0.9])
    _with_config(sweep / "0")
    _with_config(sweep / "1", **{"reward.kind": "weighted", "reward.terms.qa.weight": 2.0})
    result = json.loads((sweep / "1" / "result.json").read_text())
    result["best_val_qa_accuracy"] = result["final_val_qa_accuracy"] = None  # it logs <term>_qa_accuracy instead
    write_result(sweep / "1", result)
    for job in ("0", "1"):  # per-document scores for the paired table
        result = json.loads((sweep / job / "result.json").read_text())
        result["val_history"] = [{"step": 1, "val_reward": 0.5, "val_qa_accuracy": None,
                                  "per_doc": {f"d{i}": {"reward": 0.1 * i + (0.5 if job == "1" else 0)}
                                              for i in range(6)}}]
        write_result(sweep / job, result)
    write_report(sweep, tmp_path / "out", baseline="reward=qa")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "job(s) 1 recorded no val QA accuracy, so the score is each job's val reward" in report
    assert ("measured with different settings (reward.kind, reward.terms.qa.weight): scores measured differently "
            "are not on one scale") in report
    paired = pd.read_csv(tmp_path / "out" / "paired.csv")
    assert paired.verdict.tolist() == ["not comparable"]  # +0.5 on every document was "better"
    assert paired.note[0].startswith("measured with other settings than the baseline (reward.kind, "
                                     "reward.terms.qa.weight)")
    assert "not on one scale" in capsys.readouterr().err


def recorded_config(overrides: list[str]) -> dict:
    """The config a run with these overrides records in result.json."""
    from summrl.job import JobInfo
    from summrl.tracking import flat_config
    from tests.conftest import compose_config

    return flat_config(compose_config(["experiment=local", "judge=lexical", *overrides]), JobInfo(overrides=overrides))


def test_scores_under_other_qa_rules_or_word_limits_are_not_compared_and_a_cache_dir_is_no_difference(tmp_path):
    """reward=qa's val/qa_accuracy depends on reward.max_chars and forbid_han, and a length term's val reward on
    trainer.max_words: neither was compared, so such arms were paired as one scale; reward.cache_dir (a path a cloud
    job pins) made rubric runs 'not comparable' (found by an audit)."""
    from summrl.report import differing, measured_with, paired_table, collect

    sweep = tmp_path / "multirun"
    arms = [["reward=qa"], ["reward=qa", "reward.max_chars=100"], ["reward=rubric", "reward.cache_dir=/remote/rubrics"],
            ["reward=rubric", "trainer.val_qa_forbid_han=false"]]
    for num, overrides in enumerate(arms):
        write_job(sweep / str(num), overrides, "1", [0.2, 0.4 + 0.1 * num])
        result = json.loads((sweep / str(num) / "result.json").read_text())
        write_result(sweep / str(num), {**result, "config": recorded_config(overrides)})
    table, _, _, results = collect(sweep)
    rows = paired_table(table, results, "qa_accuracy", "reward=qa").set_index("configuration")
    assert rows.verdict.eq("not comparable").to_dict() == {"reward.max_chars=100,reward=qa": True,
                                                          "reward.cache_dir=/remote/rubrics,reward=rubric": False,
                                                          "reward=rubric,trainer.val_qa_forbid_han=false": True}
    assert "(trainer.val_qa_max_chars)" in rows.loc["reward.max_chars=100,reward=qa", "note"]
    # a result.json from before trainer.val_qa_* existed: its QA term's rules
    old = {k: v for k, v in recorded_config(["reward=qa", "reward.max_chars=100"]).items() if "val_qa" not in k}
    assert measured_with({"config": old}, "qa_accuracy") == measured_with(results["1"], "qa_accuracy")

    def reward_differs(*arms: list[str]) -> list[str]:
        return differing([measured_with({"config": recorded_config(a)}, "reward") for a in arms])

    assert reward_differs(["reward=rubric", "reward.cache_dir=/a"], ["reward=rubric", "reward.cache_dir=/b"]) == []
    assert reward_differs(["reward=length_penalized", "trainer.max_words=100"],
                          ["reward=length_penalized", "trainer.max_words=350"]) == ["trainer.max_words"]
    assert reward_differs(["reward=qa", "trainer.max_words=100"], ["reward=qa", "trainer.max_words=350"]) == []


def test_qa_accuracy_graded_by_another_judge_is_not_compared(tmp_path):
    from summrl.report import paired_table, collect

    sweep = tmp_path / "multirun"
    write_job(sweep / "0", ["judge=local"], "1", [0.2, 0.4])
    write_job(sweep / "1", ["judge=gemini_flash"], "1", [0.2, 0.9])
    write_job(sweep / "2", ["judge=local", "model.lr=2e-5"], "1", [0.2, 0.5])
    _with_config(sweep / "0")
    _with_config(sweep / "1", **{"judge.kind": "litellm", "judge.model": "gemini/gemini-2.5-flash"})
    _with_config(sweep / "2", **{"reward.kind": "weighted"})  # the reward differs: QA accuracy is still one scale
    table, _, _, results = collect(sweep)
    rows = paired_table(table, results, "qa_accuracy", "judge=local").set_index("configuration")
    assert rows.loc["judge=gemini_flash", "verdict"] == "not comparable"
    assert "(judge.kind, judge.model)" in rows.loc["judge=gemini_flash", "note"]
    assert rows.loc["judge=local,model.lr=2e-5", "verdict"] != "not comparable"


def test_an_sft_arm_whose_first_job_failed_before_sft_keeps_its_curve_aligned(tmp_path):
    """Found by an audit: the offset came from the arm's first job, which had failed before its SFT stage (no record):
    the arm's val curve was drawn one GRPO step ahead of the other arm's, under the label "training step"."""
    from summrl.report import collect, sft_offsets

    sweep = tmp_path / "sweep"
    write_job(sweep / "0", ["sft=none"], "80", [0.2, 0.3, 0.4])
    write_job(sweep / "1", ["sft=best_of_n"], "80", [0.2], status="failed")
    write_job(sweep / "2", ["sft=best_of_n"], "81", [0.2, 0.6, 0.7, 0.8])
    result = json.loads((sweep / "2" / "result.json").read_text())
    result["sft"] = {"kind": "best_of_n", "val_before": {"step": 0}, "val_after": {"step": 1}, "step": 1}
    write_result(sweep / "2", result)
    table, _, _, results = collect(sweep)
    assert sft_offsets(table, results) == {"sft=none": 0, "sft=best_of_n": 1}


def test_chart_labels_of_long_configurations_stay_distinct():
    """Found by an audit: names cut at 60 characters made a 2 x 2 sweep's four arms two bars and two legend entries."""
    from summrl.report import short_names

    names = [f"+reward.terms.length_penalty.weight={w},+reward.terms.qa.weight={q}"
             for w in (0.1, 0.2) for q in (0.25, 0.75)]
    labels = short_names(names)
    assert len(set(labels)) == 4 and all(len(label) <= 60 for label in labels)
    assert [label.endswith(f"qa.weight={q}") for label, q in zip(labels, (0.25, 0.75) * 2)] == [True] * 4
    assert short_names(["reward=qa", "reward=ruler"]) == ["reward=qa", "reward=ruler"]  # short names as they are
    alike = short_names(["a" * 40 + "x" * 30 + "b" * 40, "a" * 40 + "y" * 30 + "b" * 40])
    assert len(set(alike)) == 2 and alike[0].endswith("#1")


def test_a_sweeps_multirun_yaml_that_cant_be_read_is_a_warning_and_no_planned_jobs(tmp_path, capsys):
    """Moved into summrl.job without its sys import, an unreadable multirun.yaml ended in a NameError where it is to
    warn that the jobs that never started are not listed (found by this stop's review)."""
    from summrl.job import planned_jobs

    (tmp_path / "multirun.yaml").write_text("hydra: [\n")
    assert planned_jobs(tmp_path) == []
    assert "can't read the planned jobs from" in capsys.readouterr().err
