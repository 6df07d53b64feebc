"""`python -m summrl.report <sweep or run folder> [--out DIR]`: a table and plots of a multirun (or one run).

Writes ``summary.csv`` and ``report.md`` (one row per job: overrides, status, best and final val
score, steps, judge cost, minutes), ``val_curves.png`` (val score against step, one line per job)
and ``best_val.png`` (best val score per configuration, mean ± std over its seeds).
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

from summrl.job import RESULT_FILE, JobInfo, read_result

COLUMNS = ["job", "configuration", "seed", "status", "best_val_score", "final_val_score", "best_val_qa_accuracy",
           "final_val_qa_accuracy", "sft", "val_qa_before_sft", "val_qa_after_sft", "sft_samples_kept", "steps",
           "judge_cost_usd", "minutes", "overrides", "error"]
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


def collect(folder: Path) -> tuple[pd.DataFrame, dict[str, dict[str, list[tuple[int, float]]]], list[str]]:
    rows, curves = [], {}
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
    table = pd.DataFrame(rows, columns=COLUMNS).astype({"steps": "Int64", "sft_samples_kept": "Int64"})
    return table, curves, common


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


def plot_curves(curves: dict[str, list[tuple[int, float]]], table: pd.DataFrame, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = dict(zip(table.job, table.configuration))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for job, curve in curves.items():
        if curve:
            steps, scores = zip(*curve)
            ax.plot(steps, scores, marker="o", label=f"{job}: {labels.get(job, '')}"[:80])
    ax.set(xlabel="training step", ylabel=METRICS[metric], title=f"{METRICS[metric].split(' (')[0]} by step")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def write_report(folder: Path, out: Path) -> pd.DataFrame:
    table, curves, common = collect(folder)
    if table.empty:
        raise SystemExit(f"summrl.report: {folder} has no {RESULT_FILE} and no numbered job folders")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "summary.csv", index=False)
    metric = score_metric(table)
    stats = by_configuration(table, metric)
    plot_curves({job: c[metric] for job, c in curves.items()}, table, metric, out / "val_curves.png")
    plot_best(stats, metric, out / "best_val.png")
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
        f"![{METRICS[metric]} by step](val_curves.png)",
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
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"summrl.report: {args.folder} is not a folder", file=sys.stderr)
        return 2
    out = args.out or args.folder
    table = write_report(args.folder, out)
    print(f"summrl.report: {len(table)} jobs -> {out / 'report.md'}, summary.csv, val_curves.png, best_val.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
