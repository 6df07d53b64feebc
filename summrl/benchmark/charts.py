"""PNG charts of the summary table (matplotlib, Agg): models side by side, and the trained model per step."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _error(table: pd.DataFrame) -> list[list[float]]:
    low = (table.answered_pct - table.ci_low_pct).fillna(0).clip(lower=0)
    high = (table.ci_high_pct - table.answered_pct).fillna(0).clip(lower=0)
    return [low.tolist(), high.tolist()]


def bar_chart(table: pd.DataFrame, trained: Optional[str], path: Path) -> Path:
    """One bar per model: baselines, the base model (step 0), the SFT checkpoint (a run with an SFT stage) and the
    trained model's last step; 95% CI whiskers."""
    checkpoints = table[table.model == trained] if trained else table.iloc[0:0]
    others = table[table.model != trained] if trained else table
    shown = [others]
    if not checkpoints.empty:
        steps = checkpoints.dropna(subset=["step"]).sort_values("step")
        wanted = {steps.step.min(), steps.step.max(), *steps.step[steps.stage == "sft"]}
        shown.append(steps[steps.step.isin(wanted)])
    bars = pd.concat(shown, ignore_index=True)
    labels = [m if pd.isna(s) else f"{m}\n{stage or 'step'} (step {s})"
              for m, s, stage in zip(bars.model, bars.step, bars.stage)]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(bars) + 2), 4.5))
    colors = ["tab:orange" if m == trained else "tab:blue" for m in bars.model]
    ax.bar(range(len(bars)), bars.answered_pct, yerr=_error(bars), capsize=4, color=colors)
    tops = bars.ci_high_pct.fillna(bars.answered_pct).clip(lower=bars.answered_pct)
    for i, (value, top) in enumerate(zip(bars.answered_pct, tops)):
        ax.text(i, top + 1.5, f"{value:.0f}%", ha="center", va="bottom", fontsize=9)  # above the whisker
    ax.set_xticks(range(len(bars)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("% of questions answered from the summary")
    ax.set_ylim(0, 110)
    ax.set_title("Benchmark (95% CI over documents)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def step_chart(table: pd.DataFrame, trained: str, path: Path) -> Path:
    """The trained model's score at each benchmarked step (CI band), the other models as horizontal lines."""
    steps = table[(table.model == trained) & table.step.notna()].sort_values("step")
    baselines = table[table.model != trained]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = steps.step.astype(int).to_numpy()
    ax.plot(x, steps.answered_pct, marker="o", color="tab:orange", label=f"{trained} (step 0 = base)")
    ax.fill_between(x, steps.ci_low_pct.fillna(steps.answered_pct), steps.ci_high_pct.fillna(steps.answered_pct),
                    color="tab:orange", alpha=0.2)
    for step in steps.step[steps.stage == "sft"]:  # GRPO starts from the SFT checkpoint
        ax.axvline(int(step), linestyle=":", color="tab:gray", label=f"SFT checkpoint (step {int(step)})")
    cmap = plt.get_cmap("tab10")
    for i, line in enumerate(baselines.itertuples()):
        ax.axhline(line.answered_pct, linestyle="--", color=cmap((i + 2) % 10), label=f"{line.model} {line.answered_pct:.0f}%")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("% of questions answered from the summary")
    ax.set_ylim(0, 105)
    ax.set_title(f"{trained} per step vs baselines")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
