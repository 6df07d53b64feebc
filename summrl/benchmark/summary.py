"""The summary table: per model (and checkpoint step), over the documents every line scored, the mean % of
questions answered with a 95% confidence interval, the mean reward, mean words, the % of summaries that invent a fact (a number, date or proper name absent
from the document), and $ per 1k summaries.

The interval is a Student-t interval over documents: a document's rollouts share its questions, so they
are not independent; each document contributes the mean of its rollouts, and the interval is
``mean ± t(0.975, n-1) · sd / sqrt(n)`` over the n document means (none when n < 2).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from summrl.compare import mean_ci

CI_METHOD = "95% Student-t interval over per-document means"


def per_thousand(costs: pd.Series) -> float:
    """$ per 1k summaries; nan (unknown) if any summary's cost is unknown."""
    return math.nan if costs.isna().any() else 1000.0 * float(costs.mean())


def summarize(rows: pd.DataFrame, order: list[tuple[str, object]] | None = None,
              stages: dict[tuple[str, object], str] | None = None) -> pd.DataFrame:
    """One line per (model, step). ``order``: (model, step) pairs in the order to list them. ``stages``: the
    training stage (base, sft, grpo) of the trained run's (model, step) pairs; other models have none.

    Every line is over the documents every line scored: a model that failed a document (a content filter, a reply
    cut short) would otherwise be averaged over easier or harder ones than the rest. ``left_out`` counts a line's
    documents dropped so. When no document was scored by every line, each keeps its own (``left_out`` is then -1)."""
    key = [rows["model"], rows["step"].fillna(-1)]
    scored = rows.groupby(key, sort=False)["document_id"].agg(set)
    common = set.intersection(*scored) if len(scored) else set()
    if common:
        rows = rows[rows["document_id"].isin(common)]
    lines = []
    for (model, raw_step), group in rows.groupby(["model", rows["step"].fillna(-1)], sort=False):
        by_doc = group.groupby("document_id")["score"].mean().to_numpy()
        ci = mean_ci(by_doc)
        step = None if raw_step == -1 else int(raw_step)
        lines.append({
            "model": model,
            "step": step,
            "stage": (stages or {}).get((model, step), ""),
            "documents": len(by_doc),
            "left_out": len(scored[(model, raw_step)] - common) if common else -1,
            "summaries": len(group),
            "answered_pct": 100 * float(by_doc.mean()),
            # a share of questions: the t interval of few documents ran past it ([44.6, 102.0] over 3 documents)
            "ci_low_pct": 100 * float(np.clip(ci.low, 0.0, 1.0)),  # (NaN, one document, stays NaN)
            "ci_high_pct": 100 * float(np.clip(ci.high, 0.0, 1.0)),
            "mean_reward": float(group["reward"].mean()),
            "mean_words": float(group["words"].mean()),
            "hallucination_pct": 100 * float(group["hallucinated"].mean()),
            "usd_per_1k": per_thousand(group["model_cost_usd"] + group["judge_cost_usd"]),
            "model_usd_per_1k": per_thousand(group["model_cost_usd"]),
            "judge_usd_per_1k": per_thousand(group["judge_cost_usd"]),
        })
    table = pd.DataFrame(lines)
    if order and not table.empty:
        rank = {(m, s): i for i, (m, s) in enumerate(order)}
        table["_rank"] = [rank.get((m, None if pd.isna(s) else int(s)), len(rank)) for m, s in zip(table.model, table.step)]
        table = table.sort_values("_rank", kind="stable").drop(columns="_rank").reset_index(drop=True)
    table["step"] = table["step"].astype("Int64") if not table.empty else table.get("step")
    return table


def _money(value: float) -> str:
    return "unknown" if math.isnan(value) else f"{value:.2f}"


def _ci(low: float, high: float) -> str:
    return "n/a (1 document)" if math.isnan(low) else f"[{low:.1f}, {high:.1f}]"


def coverage_note(table: pd.DataFrame) -> str:
    """What the lines are averaged over, when some documents were not scored by every line ("" when all were)."""
    if table.empty or not (table["left_out"] != 0).any():
        return ""
    if (table["left_out"] < 0).any():
        return ("**No document was scored by every line**: each line is over its own documents, so the lines are not "
                "comparable. Rerun the same command to retry the failed summaries.\n\n")
    short = ", ".join(f"{m}{'' if pd.isna(s) else f' step {s}'} {n}" for m, s, n in
                      zip(table.model, table.step, table.left_out) if n)
    return (f"**Every line is over the {table['documents'].iloc[0]} documents every line scored**: documents some "
            f"lines failed are left out of all of them (left out, by line: {short}). Rerun the same command to retry "
            "the failed summaries.\n\n")


def failed_note(table: pd.DataFrame) -> str:
    """The $ of calls whose summaries could not be made or scored (an empty reply is paid for), which $ / 1k leaves
    out ("" when there were none)."""
    if "failed_usd" not in table or not (table["failed_calls"] > 0).any():  # (no call billed, nothing to say)
        return ""
    spent = ", ".join(f"{m}{'' if pd.isna(s) else f' step {s}'} {'unknown' if pd.isna(u) else f'${u:.4f}'} "
                      f"({c:g} calls)"
                      for m, s, u, c in zip(table.model, table.step, table.failed_usd, table.failed_calls) if c > 0)
    return (f"\n**Failed calls were paid for too**, and $ / 1k leaves them out: {spent} (`failures.jsonl` says what "
            "failed; a rerun retries the rows still missing from the table).\n")


def markdown(table: pd.DataFrame) -> str:
    header = ("| model | step | stage | docs | summaries | % answered | 95% CI | reward | words | % inventing "
              "| $ / 1k summaries |")
    lines = [header, "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in table.itertuples():
        step = "" if pd.isna(r.step) else str(r.step)
        lines.append(f"| {r.model} | {step} | {r.stage} | {r.documents} | {r.summaries} | {r.answered_pct:.1f} | "
                     f"{_ci(r.ci_low_pct, r.ci_high_pct)} | {r.mean_reward:.3f} | {r.mean_words:.0f} | {r.hallucination_pct:.1f} | {_money(r.usd_per_1k)} |")
    return coverage_note(table) + "\n".join(lines) + f"\n\nStage: what wrote the trained model's weights at that step (base = no training, " \
        f"sft = the SFT warm start's checkpoint, grpo = a GRPO step). CI: {CI_METHOD}. % inventing: summaries stating a number, date or proper name " \
        f"absent from the document. $ = model + judge calls from litellm's cost map (local models $0).\n" + failed_note(table)
