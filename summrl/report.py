"""`python -m summrl.report <sweep or run folder> [--out DIR]`: a table and plots of a multirun (or one run).

Writes ``summary.csv`` and ``report.md`` (one row per job: overrides, status, best and final val
score and QA accuracy, final val hallucination rate, steps, judge cost, minutes), ``val_curves.png``
(val score against step, one line per configuration with a 95% CI band: over its seeds when it has several,
else over the val documents)
and ``best_val.png`` (best val score per configuration, mean ± std over its seeds).
``--baseline 'reward=qa'`` adds the paired table: each configuration's final val score minus the
baseline's on the same documents and seeds, with a 95% CI, a verdict and the minimum detectable difference.
Reads only what the jobs left on disk: ``result.json`` and ART's ``history.jsonl``.

The plotted score is the val QA accuracy (the share of questions answered, logged for every reward)
when every job has it, so that different rewards are compared on one axis; otherwise the val reward.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from summrl.compare import Interval, mean_ci, min_detectable, paired_differences, per_doc, verdict
from summrl.job import RESULT_FILE, JobInfo, read_result

COLUMNS = ["job", "configuration", "seed", "status", "best_val_score", "final_val_score", "best_val_qa_accuracy",
           "final_val_qa_accuracy", "final_val_hallucination_rate", "sft", "val_qa_before_sft", "val_qa_after_sft",
           "sft_samples_kept", "steps", "judge_cost_usd", "minutes", "overrides", "error"]
SFT_COLUMNS = ["sft", "val_qa_before_sft", "val_qa_after_sft", "sft_samples_kept"]  # shown when a job has an SFT stage
METRICS = {"qa_accuracy": "val QA accuracy (share of questions answered)", "reward": "val reward"}


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
        for line in history.read_text().splitlines():
            record = json.loads(line)
            for metric in METRICS:
                if f"val/{metric}" in record:
                    curves[metric][int(record["training_step"])] = float(record[f"val/{metric}"])
    if not curves["reward"]:
        for h in result.get("val_history", []):
            curves["reward"][h["step"]] = h["val_reward"]
            if h.get("val_qa_accuracy") is not None:
                curves["qa_accuracy"][h["step"]] = h["val_qa_accuracy"]
    return {metric: sorted(curve.items()) for metric, curve in curves.items()}


def _seed(overrides: list[str]) -> str:
    return next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), "")


def common_overrides(results: list[dict]) -> list[str]:
    """Overrides every job shares: stated once, left out of each job's configuration name."""
    sets = [set(r.get("overrides", [])) for r in results]
    return sorted(set.intersection(*sets)) if len(sets) > 1 else []


def collect(folder: Path) -> tuple[pd.DataFrame, dict[str, dict[str, list[tuple[int, float]]]], list[str], dict]:
    """The jobs' table, val curves (job -> metric -> [(step, score)]), shared overrides and results (job -> dict)."""
    rows, curves, results = [], {}, {}
    jobs = [(d, read_result(d) or {"status": "missing", "error": f"no {RESULT_FILE} (job never started?)"})
            for d in job_folders(folder)]
    common = common_overrides([r for _, r in jobs])
    for job_dir, result in jobs:
        overrides = result.get("overrides", [])
        job = job_dir.name if job_dir != folder else folder.name
        sft = result.get("sft") or {}
        rows.append({
            "job": job,
            "configuration": JobInfo(overrides=[o for o in overrides if o not in common]).name,
            "seed": result.get("seed", _seed(overrides)),
            "status": result.get("status"),
            "best_val_score": result.get("best_val_score"),
            "final_val_score": result.get("final_val_score"),
            "best_val_qa_accuracy": result.get("best_val_qa_accuracy"),
            "final_val_qa_accuracy": result.get("final_val_qa_accuracy"),
            # the share of val summaries stating a number, date or name absent from their document
            "final_val_hallucination_rate": result.get("final_val_hallucination_rate"),
            "sft": sft.get("kind", "none"),
            "val_qa_before_sft": (sft.get("val_before") or {}).get("val_qa_accuracy"),
            "val_qa_after_sft": (sft.get("val_after") or {}).get("val_qa_accuracy"),
            "sft_samples_kept": sft.get("samples_kept"),
            "steps": result.get("steps"),
            "judge_cost_usd": result.get("judge_cost_usd"),
            "minutes": round(result["wall_s"] / 60, 1) if "wall_s" in result else None,
            "overrides": " ".join(overrides),
            "error": result.get("error", ""),
        })
        curves[job] = val_curves(job_dir, result)
        results[job] = result
    table = pd.DataFrame(rows, columns=COLUMNS).astype({"steps": "Int64", "sft_samples_kept": "Int64"})
    return table, curves, common, results


def score_metric(table: pd.DataFrame) -> str:
    """qa_accuracy when every completed job has it (one axis across rewards), else reward."""
    done = table[table.status == "completed"]
    return "qa_accuracy" if len(done) and done.best_val_qa_accuracy.notna().all() else "reward"


def by_configuration(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Best val score per configuration over its completed seeds: mean, std (0 for one seed), count."""
    column = "best_val_qa_accuracy" if metric == "qa_accuracy" else "best_val_score"
    done = table[table.status == "completed"]
    stats = done.groupby("configuration")[column].agg(["mean", "std", "count"]).fillna({"std": 0.0})
    return stats.sort_values("mean", ascending=False)


def curve_bands(curves: dict[str, list[tuple[int, float]]], table: pd.DataFrame, results: dict,
                metric: str) -> dict[str, tuple[str, list[tuple[int, Interval]]]]:
    """configuration -> (what the band is over, [(step, mean and 95% CI)]).

    Several seeds: the mean over seeds and its CI over seeds. One: the CI over the val documents (per_doc).
    """
    bands = {}
    for configuration, jobs in table.groupby("configuration", sort=False).job:
        jobs = [job for job in jobs if curves.get(job)]
        if len(jobs) > 1:
            steps = sorted({step for job in jobs for step, _ in curves[job]})
            by_step = {job: dict(curves[job]) for job in jobs}
            bands[configuration] = (f"{len(jobs)} seeds", [
                (step, mean_ci(by_step[job][step] for job in jobs if step in by_step[job])) for step in steps])
        elif jobs:
            (job,) = jobs
            points = []
            for step, score in curves[job]:
                docs = per_doc(results[job], metric, step)
                ci = mean_ci(docs.values())
                points.append((step, Interval(score, ci.low, ci.high, ci.n, ci.sd) if docs else mean_ci([score])))
            bands[configuration] = (f"{points[0][1].n} documents" if points and points[0][1].n > 1 else "one run",
                                    points)
    return bands


def plot_curves(bands: dict[str, tuple[str, list[tuple[int, Interval]]]], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for configuration, (over, points) in bands.items():
        steps = [step for step, _ in points]
        line, = ax.plot(steps, [ci.mean for _, ci in points], marker="o",
                        label=f"{configuration[:60]} (95% CI over {over})")
        ax.fill_between(steps, [ci.low for _, ci in points], [ci.high for _, ci in points], color=line.get_color(),
                        alpha=0.2, linewidth=0)
    ax.set(xlabel="training step", ylabel=METRICS[metric], title=f"{METRICS[metric].split(' (')[0]} by step")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def matching_configuration(table: pd.DataFrame, baseline: str) -> str:
    """The one configuration whose jobs' overrides include every override of ``baseline`` (e.g. 'reward=qa')."""
    wanted = set(baseline.split())
    matches = sorted({c for c, o in zip(table.configuration, table.overrides) if wanted <= set(o.split())})
    if len(matches) != 1:
        raise SystemExit(f"summrl.report: --baseline {baseline!r} matches {len(matches)} configurations "
                         f"({', '.join(matches) or 'none'}); configurations: {', '.join(sorted(set(table.configuration)))}")
    return matches[0]


def paired_table(table: pd.DataFrame, results: dict, metric: str, baseline: str) -> pd.DataFrame:
    """Each configuration's last val pass minus the baseline's, paired over documents and seeds."""
    done = table[table.status == "completed"]
    scores = {configuration: {str(seed): per_doc(results[job], metric) for job, seed in zip(rows.job, rows.seed)}
              for configuration, rows in done.groupby("configuration", sort=False)}
    rows = []
    for configuration, arm in scores.items():
        if configuration == baseline:
            continue
        diff = mean_ci(paired_differences(arm, scores.get(baseline, {})))
        rows.append({"configuration": configuration, "baseline": baseline, "pairs": diff.n, "difference": diff.mean,
                     "ci_low": diff.low, "ci_high": diff.high, "verdict": verdict(diff),
                     "min_detectable": min_detectable(diff.sd, diff.n)})
    return pd.DataFrame(rows, columns=["configuration", "baseline", "pairs", "difference", "ci_low", "ci_high",
                                       "verdict", "min_detectable"])


def paired_section(paired: pd.DataFrame, metric: str) -> list[str]:
    return [
        f"## Difference from the baseline: final {METRICS[metric]}, paired over documents and seeds",
        "",
        paired.to_markdown(index=False, floatfmt=".3f") if len(paired) else "No other completed configuration.",
        "",
        "`difference` is the mean of (arm - baseline) over every (seed, val document) both scored, with its 95%"
        " Student-t CI (`ci_low`, `ci_high`); the verdict is `better` or `worse` when the CI excludes 0."
        " `min_detectable` is the true difference this noise and number of pairs find with 80% power: smaller"
        " ones are likely missed. It shrinks as 1/sqrt(pairs): to halve it, use 4x the val documents"
        " (`dataset.val_size`) or seeds; more summaries per document (`trainer.val_rollouts_per_doc`) only reduce"
        " the sampling part of the noise, not the spread between documents.",
        "",
    ]


def plot_best(stats: pd.DataFrame, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 * max(len(stats), 2) + 1.5))
    names = [n[:60] for n in stats.index]
    ax.barh(names, stats["mean"], xerr=stats["std"], capsize=4, color="tab:blue")
    for i, (mean, n) in enumerate(zip(stats["mean"], stats["count"])):
        ax.text(mean, i, f" {mean:.3f} (n={n})", va="center", fontsize=8)
    ax.invert_yaxis()
    name = METRICS[metric].split(" (")[0]
    ax.set(xlabel=f"best {name} (mean ± std over seeds)", title=f"Best {name} per configuration")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(folder: Path, out: Path, baseline: str | None = None) -> pd.DataFrame:
    table, curves, common, results = collect(folder)
    if table.empty:
        raise SystemExit(f"summrl.report: {folder} has no {RESULT_FILE} and no numbered job folders")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "summary.csv", index=False)
    metric = score_metric(table)
    stats = by_configuration(table, metric)
    plot_curves(curve_bands({job: c[metric] for job, c in curves.items()}, table, results, metric), metric,
                out / "val_curves.png")
    plot_best(stats, metric, out / "best_val.png")
    paired = None
    if baseline:
        paired = paired_table(table, results, metric, matching_configuration(table, baseline))
        paired.to_csv(out / "paired.csv", index=False)
    hidden = ["overrides"] + (SFT_COLUMNS if (table.sft == "none").all() else [])
    shown = table.drop(columns=hidden).astype(object).where(table.notna().drop(columns=hidden), "")
    lines = [
        f"# Report: {folder}",
        "",
        f"{len(table)} jobs: " + ", ".join(f"{n} {s}" for s, n in table.status.value_counts().items()) + ".",
        "",
        f"Overrides common to every job: `{' '.join(common)}`" if common else "",
        "",
        "## Jobs",
        "",
        shown.to_markdown(index=False, floatfmt=".3f"),
        "",
        f"## Best {METRICS[metric]} per configuration (completed jobs; mean ± std over seeds)",
        "",
        stats.reset_index().to_markdown(index=False, floatfmt=".3f") if len(stats) else "No completed job.",
        "",
        *(paired_section(paired, metric) if paired is not None else []),
        f"![{METRICS[metric]} by step, 95% CI bands](val_curves.png)",
        "",
        f"![best {METRICS[metric]} per configuration](best_val.png)",
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
    table = write_report(args.folder, out, args.baseline)
    print(f"summrl.report: {len(table)} jobs -> {out / 'report.md'}, summary.csv, val_curves.png, best_val.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
