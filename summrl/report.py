"""`python -m summrl.report <sweep or run folder> [--out DIR]`: a table and plots of a multirun (or one run).

Writes ``summary.csv`` and ``report.md`` (one row per job: overrides, status, best and final val
score and QA accuracy, final val hallucination rate, steps, judge cost, minutes), ``val_curves.png``
(val score against step, one line per configuration with a 95% CI band: over its seeds when it has several,
else over the val documents; arms with an SFT stage are drawn on the GRPO steps, their SFT at step 0)
and ``final_val.png`` (final val score per configuration, mean ± std over its seeds).
``--baseline 'reward=qa'`` adds the paired table: each configuration's final val score minus the
baseline's on the same documents and seeds, with a 95% CI (seeds × documents, see summrl.compare), a verdict,
the minimum detectable difference and where the noise comes from.
Reads only what the jobs left on disk: ``result.json`` and ART's ``history.jsonl``.

The plotted score is the val QA accuracy (the share of questions answered, logged for every reward)
when every job has it, so that different rewards are compared on one axis; otherwise the val reward.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections import Counter
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd

from summrl.compare import MIN_PAIRS, Interval, advice, holm, mean_ci, paired, per_doc
from summrl.config import OPERATIONAL, AlgorithmConfig
from summrl.job import (RESULT_FILE, JobInfo, jsonl_rows, override_key, planned_jobs, read_result, scale_settings,
                        val_sampling)
from summrl.secrets import redact

COLUMNS = ["job", "configuration", "seed", "status", "best_val_score", "final_val_score", "best_val_qa_accuracy",
           "final_val_qa_accuracy", "final_val_hallucination_rate", "val_passes", "algorithm", "sft", "val_qa_before_sft",
           "val_qa_after_sft", "sft_samples_kept", "steps", "steps_untrained", "judge_cost_usd", "minutes", "overrides",
           "error"]
SFT_COLUMNS = ["sft", "val_qa_before_sft", "val_qa_after_sft", "sft_samples_kept"]  # shown when a job has an SFT stage
METRICS = {"qa_accuracy": "val QA accuracy (share of questions answered)", "reward": "val reward"}
# Compared in the paired table beside the score when every job measured it (lower is better).
SIDE_METRICS = {"hallucination_rate": "val hallucination rate (share of summaries inventing a fact; lower is better)"}
LABELS = {**METRICS, **SIDE_METRICS}


def job_folders(folder: Path) -> list[Path]:
    """The run folder itself, or the sweep's job folders (numbered), in job order."""
    if (folder / RESULT_FILE).is_file():
        return [folder]
    jobs = [p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(jobs, key=lambda p: int(p.name))


def val_curves(job_dir: Path, result: dict) -> dict[str, list[tuple[int, float]]]:
    """Val reward and QA accuracy per step, from ART's history (complete even for a failed or resumed job)."""
    curves: dict[str, dict[int, float]] = {metric: {} for metric in METRICS}
    for history in sorted(job_dir.glob("art/*/models/*/history.jsonl")):
        for record in jsonl_rows(history.read_text()):  # a line a crash cut short is skipped
            for metric in METRICS:
                if f"val/{metric}" in record:
                    curves[metric][int(record["training_step"])] = float(record[f"val/{metric}"])
    if not curves["reward"]:
        for h in result.get("val_history", []):
            curves["reward"][h["step"]] = h["val_reward"]
            if h.get("val_qa_accuracy") is not None:
                curves["qa_accuracy"][h["step"]] = h["val_qa_accuracy"]
    return {metric: sorted(curve.items()) for metric, curve in curves.items()}


def algorithm_summary(algorithm: dict | None) -> str:
    """The update's settings that differ from ART's defaults, e.g. "grpo_kl: kl_penalty_coef=0.001" ("" = defaults)."""
    if not algorithm:
        return ""
    defaults = AlgorithmConfig()
    changed = [f"{f.name}={algorithm[f.name]}" for f in fields(AlgorithmConfig)
               if f.name != "name" and f.name in algorithm and algorithm[f.name] != getattr(defaults, f.name)]
    return f"{algorithm.get('name', '')}: {', '.join(changed)}" if changed else ""


def _seed(overrides: list[str]) -> str:
    return next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), "")


def common_overrides(results: list[dict]) -> list[str]:
    """Overrides every job shares: stated once, left out of each job's configuration name."""
    sets = [set(r.get("overrides", [])) for r in results]
    return sorted(set.intersection(*sets)) if len(sets) > 1 else []


def presets(overrides: list[str]) -> list[str]:
    return sorted(o for o in overrides if override_key(o) == "experiment")


def configuration_name(overrides: list[str], with_preset: bool) -> str:
    """A job's configuration, as the report groups seeds: its name, with the preset it picked when the jobs' presets
    differ. W&B names leave ``experiment=`` out; arms that differed by preset alone were merged into one "defaults",
    their scores averaged as if seeds of one configuration."""
    name = JobInfo(overrides=overrides).name
    preset = presets(overrides) if with_preset else []
    return ",".join([*preset, *([name] if name != "defaults" else [])]) or "defaults"


def _unread(job_dir: Path) -> dict:
    """A job without a readable result.json: none (never started, or killed before its first save), or one that is not
    JSON (cut, or edited). Its overrides are Hydra's, so it is named as its configuration."""
    overrides = _hydra_overrides(job_dir)
    if not (job_dir / RESULT_FILE).is_file():
        started = (job_dir / "train.log").is_file()
        return {"status": "missing", "overrides": overrides,
                "error": f"no {RESULT_FILE}: " + ("it started (see its train.log) and was killed before its first "
                                                  "save" if started else "it never started")}
    print(f"summrl.report: warning: {job_dir / RESULT_FILE} is not valid JSON: that job is shown as unreadable",
          file=sys.stderr)
    return {"status": "unreadable", "overrides": overrides,
            "error": f"{RESULT_FILE} is not valid JSON: restore it (e.g. summrl.sweep pull, or its S3 backup) or "
                     "rerun the job"}


def _hydra_overrides(job_dir: Path) -> list[str]:
    """The job's overrides as Hydra saved them before it started (``.hydra/overrides.yaml``)."""
    from omegaconf import OmegaConf

    try:
        return redact([str(o) for o in OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")])
    except Exception:  # none (not a Hydra job folder), or unreadable
        return []


def collect(folder: Path) -> tuple[pd.DataFrame, dict[str, dict[str, list[tuple[int, float]]]], list[str], dict]:
    """The jobs' table, val curves (job -> metric -> [(step, score)]), shared overrides and results (job -> dict)."""
    rows, curves, results = [], {}, {}
    jobs = [(d, read_result(d) or _unread(d)) for d in job_folders(folder)]
    if jobs and jobs[0][0] != folder:  # a sweep: the jobs it planned that have no folder (it stopped before them)
        present = {d.name for d, _ in jobs}
        jobs += [(folder / str(num), {"status": "not started", "overrides": overrides,
                                      "error": "the sweep stopped before this job (it has no folder)"})
                 for num, overrides in enumerate(planned_jobs(folder)) if str(num) not in present]
        jobs.sort(key=lambda job: int(job[0].name))
    common = common_overrides([r for _, r in jobs])
    by_preset = len({tuple(presets(r.get("overrides", []))) for _, r in jobs}) > 1
    for job_dir, result in jobs:
        overrides = result.get("overrides", [])
        job = job_dir.name if job_dir != folder else folder.name
        sft = result.get("sft") or {}
        rows.append({
            "job": job,
            "configuration": configuration_name([o for o in overrides if o not in common], by_preset),
            "seed": result.get("seed", _seed(overrides)),
            "status": result.get("status"),
            "best_val_score": result.get("best_val_score"),
            "final_val_score": result.get("final_val_score"),
            "best_val_qa_accuracy": result.get("best_val_qa_accuracy"),
            "final_val_qa_accuracy": result.get("final_val_qa_accuracy"),
            # the share of val summaries stating a number, date or name absent from their document
            "final_val_hallucination_rate": result.get("final_val_hallucination_rate"),
            # how many val passes "best" is the maximum of: more passes, more chances of a lucky one
            "val_passes": len(result.get("val_history") or []) or None,
            "algorithm": algorithm_summary(result.get("algorithm")),
            "sft": sft.get("kind", "none"),
            "val_qa_before_sft": (sft.get("val_before") or {}).get("val_qa_accuracy"),
            "val_qa_after_sft": (sft.get("val_after") or {}).get("val_qa_accuracy"),
            "sft_samples_kept": sft.get("samples_kept"),
            # GRPO steps: ART counts an SFT stage as a step of its own (sft.step), which arms without one lack
            "steps": result["steps"] - sft.get("step", 0) if result.get("steps") is not None else None,
            # steps at which no group was trained (every summary of each group scored alike): an arm that learned
            # nothing shows here rather than as a val curve that merely stayed flat
            "steps_untrained": len(result["untrained_steps"]) if "untrained_steps" in result else None,
            # unknown (empty) where a judge reply came without token counts: its $ is not known, never $0
            "judge_cost_usd": None if result.get("judge_unpriced_calls") else result.get("judge_cost_usd"),
            "minutes": round(result["wall_s"] / 60, 1) if "wall_s" in result else None,
            "overrides": " ".join(overrides),
            "error": result.get("error", ""),
        })
        curves[job] = val_curves(job_dir, result)
        results[job] = result
    for row in rows:  # a result without its val history (written before it was kept): the history.jsonl's passes
        curve = curves[row["job"]]
        row["val_passes"] = row["val_passes"] or len(curve["qa_accuracy"] or curve["reward"]) or None
    table = pd.DataFrame(rows, columns=COLUMNS).astype({"steps": "Int64", "steps_untrained": "Int64",
                                                        "sft_samples_kept": "Int64", "val_passes": "Int64"})
    return table, curves, common, results


def score_metric(table: pd.DataFrame) -> str:
    """qa_accuracy when every completed job has it (one axis across rewards), else reward."""
    done = table[table.status == "completed"]
    return "qa_accuracy" if len(done) and done.best_val_qa_accuracy.notna().all() else "reward"


def measured_with(result: dict, metric: str) -> dict[str, str]:
    """The settings ``metric`` was measured with (dotted key -> value), from the job's saved config; a result.json
    without one: its judge and reward choices and the overrides that touch them."""
    config = result.get("config")
    if metric not in METRICS:  # the hallucination rate: counted in the text itself, by no judge, of the val draws
        return val_sampling(config) if isinstance(config, dict) else {}
    if isinstance(config, dict):
        return scale_settings(config, metric)
    groups = ("judge", "reward") if metric == "reward" else ("judge",)
    said = {f"{g}": c for g, c in (result.get("choices") or {}).items() if g in groups}
    said.update(o.split("=", 1) for o in result.get("overrides", [])
                if "=" in o and override_key(o).lstrip("+").split(".")[0] in groups
                and not override_key(o).endswith(OPERATIONAL))
    return {k.lstrip("+"): str(v) for k, v in sorted(said.items())}


def differing(settings: list[dict[str, str]]) -> list[str]:
    """The keys whose values are not the same in every one of ``settings``."""
    keys = set().union(*settings) if settings else set()
    return sorted(k for k in keys if len({s.get(k) for s in settings}) > 1)


def not_on_one_scale(table: pd.DataFrame, results: dict, metric: str) -> list[str]:
    """The settings the completed jobs' ``metric`` differs in ([]: one scale)."""
    done = table[table.status == "completed"]
    return differing([measured_with(results[job], metric) for job in done.job])


def by_configuration(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per configuration, over its completed seeds: the final val score's mean and std (0 for one seed), the seeds,
    the mean best val score and the val passes it is the best of. Sorted by the final score: the best of more passes
    is higher by chance alone, so arms that validated more often would rank above as good ones."""
    columns = {"qa_accuracy": ("final_val_qa_accuracy", "best_val_qa_accuracy"),
               "reward": ("final_val_score", "best_val_score")}[metric]
    done = table[table.status == "completed"].astype({columns[0]: float, columns[1]: float})
    grouped = done.groupby("configuration")
    stats = grouped[columns[0]].agg(["mean", "std", "count"]).fillna({"std": 0.0}).rename(
        columns={"mean": "final_mean", "std": "final_std", "count": "seeds"})
    stats["best_mean"] = grouped[columns[1]].mean()
    passes = grouped.val_passes.agg(["min", "max"])
    stats["val_passes"] = ["" if pd.isna(low) else str(low) if low == high else f"{low}-{high}"
                           for low, high in zip(passes["min"], passes["max"])]
    return stats.sort_values("final_mean", ascending=False)


def curve_bands(curves: dict[str, list[tuple[int, float]]], table: pd.DataFrame, results: dict,
                metric: str) -> dict[str, tuple[str, list[tuple[int, Interval]]]]:
    """configuration -> (what the band is over, [(step, mean and 95% CI)]).

    Completed jobs only. Several seeds: the mean over seeds and its CI over seeds, at the steps every seed has. One:
    the mean and CI over the val documents (per_doc), so that the line and its band are one estimate; runs without
    per-document scores get a line and no band.
    """
    bands = {}
    completed = table[table.status == "completed"]  # a failed seed's curve stops early: the band would lose it midway
    for configuration, jobs in completed.groupby("configuration", sort=False).job:
        jobs = [job for job in jobs if curves.get(job)]
        if len(jobs) > 1:  # the steps every seed measured, so that each point is over the same seeds
            steps = sorted(set.intersection(*({step for step, _ in curves[job]} for job in jobs)))
            by_step = {job: dict(curves[job]) for job in jobs}
            bands[configuration] = (f"{len(jobs)} seeds", [
                (step, mean_ci(by_step[job][step] for job in jobs if step in by_step[job])) for step in steps])
        elif jobs:
            (job,) = jobs
            points = []
            for step, score in curves[job]:
                docs = per_doc(results[job], metric, step)
                points.append((step, mean_ci(docs.values()) if docs else mean_ci([score])))
            bands[configuration] = (f"{points[0][1].n} documents" if points and points[0][1].n > 1 else "one run",
                                    points)
    return bands


def sft_offsets(table: pd.DataFrame, results: dict) -> dict[str, int]:
    """configuration -> its SFT stage's step (0 without one): its GRPO step k is ART's step k + offset. The largest over
    its jobs: one that failed or never started before its SFT stage has no record (it shifted the arm's curve)."""
    return {configuration: max(int((results[job].get("sft") or {}).get("step", 0)) for job in jobs)
            for configuration, jobs in table.groupby("configuration", sort=False).job}


def short_names(names: list[str], width: int = 60) -> list[str]:
    """Chart labels of at most about ``width`` characters, each configuration its own: a long name keeps its start and
    its end (where sweeps' names differ), and labels still alike are numbered. Names cut at 60 characters merged
    arms of a two-axis sweep into one bar and one legend entry."""
    half = (width - 1) // 2
    short = [n if len(n) <= width else f"{n[:half]}…{n[-(width - 1 - half):]}" for n in names]
    alike, numbered = Counter(short), Counter()
    out = []
    for label in short:
        if alike[label] > 1:
            numbered[label] += 1
            label = f"{label} #{numbered[label]}"
        out.append(label)
    return out


def plot_curves(bands: dict[str, tuple[str, list[tuple[int, Interval]]]], metric: str, path: Path,
                offsets: dict[str, int] | None = None) -> None:
    """One line per configuration with its 95% CI band, against the GRPO step: an arm with an SFT stage starts at
    step 0 with its val before SFT, then jumps (still at 0) to its val after SFT, so arms line up step for step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    offsets = offsets or {}
    bounded = metric == "qa_accuracy"  # a share: its CI is clipped to [0, 1]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = dict(zip(bands, short_names(list(bands))))
    for configuration, (over, points) in bands.items():
        offset = offsets.get(configuration, 0)
        steps = [max(step - offset, 0) for step, _ in points]
        low = [ci.low for _, ci in points]
        high = [ci.high for _, ci in points]
        if bounded:
            low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
        line, = ax.plot(steps, [ci.mean for _, ci in points], marker="o",
                        label=f"{labels[configuration]} (95% CI over {over})")
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    any_sft = any(offsets.values())
    ax.set(xlabel="GRPO step (SFT arms: before and after SFT at 0)" if any_sft else "training step",
           ylabel=METRICS[metric], title=f"{METRICS[metric].split(' (')[0]} by step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if bounded:  # autoscaled, but never past what a share can be
        low_limit, high_limit = ax.get_ylim()
        ax.set_ylim(max(low_limit, -0.02), min(high_limit, 1.02))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def matching_configuration(table: pd.DataFrame, results: dict, baseline: str) -> str:
    """The one configuration whose jobs have every override of ``baseline`` (e.g. 'reward=qa'), as a command-line
    override or as a config group's choice (so that 'algorithm=grpo' matches jobs that left the default)."""
    try:
        wanted = set(shlex.split(baseline))
    except ValueError as e:  # a stray quote: a traceback
        raise ReportError(f"summrl.report: --baseline {baseline!r}: {e}; write it as an override, e.g. "
                          "reward=qa") from None
    matches = set()
    for job, configuration in zip(table.job, table.configuration):
        result = results[job]
        said = set(result.get("overrides", [])) | {f"{g}={c}" for g, c in (result.get("choices") or {}).items()}
        if wanted <= said:
            matches.add(configuration)
    if len(matches) != 1:
        raise ReportError(f"summrl.report: --baseline {baseline!r} matches {len(matches)} configurations "
                          f"({', '.join(sorted(matches)) or 'none'}); configurations: "
                          f"{', '.join(sorted(set(table.configuration)))}")
    chosen = matches.pop()
    if not (table[table.configuration == chosen].status == "completed").any():
        # its failed jobs' seeds read as "only in this arm": an empty paired table that sent the user to add seeds
        raise ReportError(f"summrl.report: --baseline {baseline!r} names {chosen}, which has no completed job (its "
                          f"jobs: {', '.join(sorted(set(table[table.configuration == chosen].status)))}): nothing to "
                          "compare with; rerun or resume its jobs, or name another baseline")
    return chosen


def paired_table(table: pd.DataFrame, results: dict, metric: str, baseline: str,
                 lower_is_better: bool = False) -> pd.DataFrame:
    """Each configuration's last val pass minus the baseline's, over the seeds both ran and the documents every one
    of those jobs scored (see summrl.compare). ``note`` says what could not be paired. The verdicts are by Holm's
    adjusted p-values (``p_holm``) over the arms compared: each one is a test, and with several some pass by chance.
    An arm whose score was measured with other settings (another judge; for the val reward, another reward) is not
    compared."""
    done = table[table.status == "completed"]
    settings = {job: measured_with(results[job], metric) for job in done.job}
    scores: dict[str, dict[str, dict[str, float]]] = {}
    samples: dict[str, dict[str, dict[str, float]]] = {}  # how many summaries each document's score is the mean of
    notes: dict[str, list[str]] = {}
    for configuration, rows in done.groupby("configuration", sort=False):
        by_seed = scores.setdefault(configuration, {})
        for job, seed in zip(rows.job, rows.seed):
            if str(seed) in by_seed:
                notes.setdefault(configuration, []).append(f"seed {seed} ran twice: job {job} used")
            by_seed[str(seed)] = per_doc(results[job], metric)
            samples.setdefault(configuration, {})[str(seed)] = per_doc(results[job], "n")
    base = scores.get(baseline, {})
    base_settings = [settings[job] for job in done[done.configuration == baseline].job]
    rows, tests = [], []
    for configuration, arm in scores.items():
        if configuration == baseline:
            continue
        note = list(notes.get(configuration, [])) + [f"baseline: {n}" for n in notes.get(baseline, [])]
        seeds = sorted(set(arm) & set(base))
        for name, only in (("this arm", set(arm) - set(base)), ("the baseline", set(base) - set(arm))):
            if only:
                note.append(f"seed {', '.join(sorted(only))} only in {name}")
        # a seed one side has no per-document scores for (a val pass that scored nothing) is left out, not allowed
        # to empty the intersection of documents for every other seed
        unscored = [s for s in seeds if not arm[s] or not base[s]]
        if unscored:
            note.append(f"seed {', '.join(unscored)} left out: no per-document {metric} on one side")
            seeds = [s for s in seeds if s not in unscored]
        every = [set(arm[s]) & set(base[s]) for s in seeds]
        docs = sorted(set.intersection(*every)) if every else []
        # every document either side scored for a paired seed: one scored by one side alone was not counted
        dropped = len(set().union(*(set(arm[s]) | set(base[s]) for s in seeds))) - len(docs)
        if dropped:
            note.append(f"{dropped} document(s) not scored in every job (missing rewards, or val sets that differ: "
                        "dataset.seed, dataset.val_size)")
        counts = samples.get(configuration, {}), samples.get(baseline, {})
        uneven = sum(counts[0].get(s, {}).get(d) != counts[1].get(s, {}).get(d) for s in seeds for d in docs)
        if uneven:  # a reward missing on one side, or other val sizes: that pair's means are over other draws
            drawn = [sorted({str((results[job].get("config") or {}).get("trainer.val_rollouts_per_doc"))
                             for job in done[done.configuration == c].job}) for c in (configuration, baseline)]
            why = ("missing rewards" if drawn[0] == drawn[1] else
                   f"trainer.val_rollouts_per_doc={', '.join(drawn[0])} here, {', '.join(drawn[1])} in the baseline")
            note.append(f"{uneven} pair(s) scored from different numbers of summaries on the two sides ({why})")
        result = paired(np.array([[arm[s][d] - base[s][d] for d in docs] for s in seeds]).reshape(len(seeds), len(docs)))
        if len(seeds) == 1:
            note.append("one seed: a comparison of these two trained checkpoints, not of the arms' training")
        unlike = differing(base_settings + [settings[job] for job in done[done.configuration == configuration].job])
        if unlike:
            note.insert(0, f"measured with other settings than the baseline ({', '.join(unlike)}): its "
                           f"{LABELS[metric].split(' (')[0]} is on another scale")
        # Holm's family: the arms that can get a verdict (one with too few pairs raised the others' p-values)
        tests.append(math.nan if unlike or result.pairs < MIN_PAIRS else result.p)
        rows.append({"configuration": configuration, "baseline": baseline, "seeds": result.seeds,
                     "documents": result.documents, "difference": result.difference, "ci_low": result.low,
                     "ci_high": result.high, "verdict": "not comparable" if unlike else None,
                     "min_detectable": result.min_detectable, "noise": advice(result), "note": note, "paired": result})
    tested = sum(math.isfinite(p) for p in tests)
    for row, p in zip(rows, holm(tests)):
        row["p_holm"] = p
        if row["verdict"] is None:
            row["verdict"] = row["paired"].verdict(lower_is_better, p if math.isfinite(p) else None)
            if tested > 1 and row["verdict"] == "no detectable difference" and math.isfinite(row["ci_low"]) and (
                    row["ci_low"] > 0 or row["ci_high"] < 0):
                row["note"].append(f"its own 95% CI excludes 0, but not after Holm's adjustment for the {tested} arms "
                                   "compared")
        row["note"] = "; ".join(row.pop("note"))
        del row["paired"]
    return pd.DataFrame(rows, columns=["configuration", "baseline", "seeds", "documents", "difference", "ci_low",
                                       "ci_high", "p_holm", "verdict", "min_detectable", "noise", "note"])


def paired_section(paired_rows: pd.DataFrame, metric: str, side: dict[str, pd.DataFrame]) -> list[str]:
    return [
        f"## Difference from the baseline: final {METRICS[metric]}, paired over seeds and documents",
        "",
        paired_rows.to_markdown(index=False, floatfmt=".3f") if len(paired_rows) else "No other completed configuration.",
        "",
        "`difference` is the mean of (arm - baseline) over every (seed, val document) pair, both arms sampled with"
        " the same seeds, with its 95% CI (`ci_low`, `ci_high`). The documents of one seed share its training"
        " randomness, so the CI is not the pooled t over pairs: a two-way random-effects ANOVA splits the noise"
        " into seeds, documents and the rest (summrl/compare.py), and `noise` says which part is largest and what"
        " to raise. The verdict is `better` or `worse` when `p_holm` is below 0.05: the p-value of no difference,"
        " adjusted by Holm's method for the number of arms compared with the baseline (with one arm, exactly when the"
        " CI excludes 0; the CIs are not adjusted). `no noise estimate`: every pair differed by the same amount, so"
        " nothing says how far that is from chance. `min_detectable` is the true difference this noise and size find"
        f" with {int(100 * 0.8)}% power, for one arm: smaller ones are likely missed.",
        "",
        *(line for name, rows in side.items() if len(rows) for line in (
            f"## Difference from the baseline: final {SIDE_METRICS[name]}", "",
            rows.drop(columns=["baseline"]).to_markdown(index=False, floatfmt=".3f"), "")),
    ]


def plot_final(stats: pd.DataFrame, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 * max(len(stats), 2) + 1.5))
    positions = range(len(stats))  # by position: two labels alike must still be two bars
    ax.barh(positions, stats["final_mean"], xerr=stats["final_std"], capsize=4, color="tab:blue")
    ax.set_yticks(positions, short_names(list(stats.index)))
    for i, (mean, n) in enumerate(zip(stats["final_mean"], stats["seeds"])):
        ax.text(mean, i, f" {mean:.3f} (n={n})", va="center", fontsize=8)
    ax.invert_yaxis()
    name = METRICS[metric].split(" (")[0]
    ax.set(xlabel=f"final {name} (mean ± std over seeds)", title=f"Final {name} per configuration")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scale_warnings(table: pd.DataFrame, metric: str, unlike: list[str]) -> list[str]:
    """What the reader must know before comparing the rows: a score that fell back to the val reward, and jobs whose
    score was measured with different settings."""
    warnings = []
    if metric == "reward":
        done = table[table.status == "completed"]
        lacking = done[done.best_val_qa_accuracy.isna()].job.tolist()
        if lacking and len(lacking) < len(done):
            warnings.append(f"job(s) {', '.join(map(str, lacking))} recorded no val QA accuracy, so the score is each"
                            " job's val reward")
    if unlike:
        warnings.append(f"the jobs' {METRICS[metric].split(' (')[0]} was measured with different settings "
                        f"({', '.join(unlike)}): scores measured differently are not on one scale, and the "
                        "paired table does not compare them")
    return warnings


class ReportError(Exception):
    """Bad input (a folder with no runs, a baseline that names no one configuration, an --out that can't be a
    folder): one line, exit code 2, nothing written."""


def write_report(folder: Path, out: Path, baseline: str | None = None) -> pd.DataFrame:
    table, curves, common, results = collect(folder)
    if table.empty:
        raise ReportError(f"summrl.report: {folder} has no {RESULT_FILE} and no numbered job folders")
    if baseline:  # refused before anything is written
        baseline = matching_configuration(table, results, baseline)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"summrl.report: --out {out}: can't write a folder there ({e.strerror or e}); name a "
                          "folder") from None
    table.to_csv(out / "summary.csv", index=False)
    metric = score_metric(table)
    stats = by_configuration(table, metric)
    plot_curves(curve_bands({job: c[metric] for job, c in curves.items()}, table, results, metric), metric,
                out / "val_curves.png", sft_offsets(table, results))
    plot_final(stats, metric, out / "final_val.png")
    warnings = scale_warnings(table, metric, not_on_one_scale(table, results, metric))
    for warning in warnings:
        print(f"summrl.report: warning: {warning}", file=sys.stderr)
    paired, side = None, {}
    if baseline:
        paired = paired_table(table, results, metric, baseline)
        side = {name: paired_table(table, results, name, baseline, lower_is_better=True) for name in SIDE_METRICS
                if all(per_doc(results[job], name) for job in table[table.status == "completed"].job)}
        pd.concat([rows.assign(metric=name) for name, rows in {metric: paired, **side}.items()]).to_csv(
            out / "paired.csv", index=False)
    else:  # an earlier report's, with a baseline: it no longer matches the tables beside it
        (out / "paired.csv").unlink(missing_ok=True)
    hidden = (["overrides"] + (SFT_COLUMNS if (table.sft == "none").all() else [])
              + (["algorithm"] if (table.algorithm == "").all() else []))
    shown = table.drop(columns=hidden).astype(object).where(table.notna().drop(columns=hidden), "")
    shown["error"] = shown["error"].map(lambda e: " ".join(str(e).split()))  # a line break ends a markdown row
    lines = [
        f"# Report: {folder}",
        "",
        f"{len(table)} jobs: " + ", ".join(f"{n} {s}" for s, n in table.status.value_counts().items()) + ".",
        "",
        f"Overrides common to every job: `{' '.join(common)}`" if common else "",
        "",
        *(line for warning in warnings for line in (f"**Warning:** {warning}", "")),
        "## Jobs",
        "",
        shown.to_markdown(index=False, floatfmt=".3f"),
        "",
        f"## Final {METRICS[metric]} per configuration (completed jobs; mean ± std over seeds)",
        "",
        stats.reset_index().to_markdown(index=False, floatfmt=".3f") if len(stats) else "No completed job.",
        "",
        "`best_mean` is the mean over seeds of each job's best val pass, out of `val_passes`: the best of more passes"
        " is higher by chance alone, so the table is sorted by the final pass.",
        "",
        *(paired_section(paired, metric, side) if paired is not None else []),
        f"![{METRICS[metric]} by step, 95% CI bands](val_curves.png)",
        "",
        f"![final {METRICS[metric]} per configuration](final_val.png)",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m summrl.report", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a sweep folder (multirun/<date>/<time>) or one run folder")
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: the folder)")
    parser.add_argument("--baseline", default=None,
                        help="overrides naming the baseline configuration, e.g. 'reward=qa': adds the paired table")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"summrl.report: {args.folder} is not a folder", file=sys.stderr)
        return 2
    out = args.out or args.folder
    try:
        table = write_report(args.folder, out, args.baseline)
    except ReportError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"summrl.report: {len(table)} jobs -> {out / 'report.md'}, summary.csv, val_curves.png, final_val.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
