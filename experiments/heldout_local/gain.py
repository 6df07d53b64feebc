"""The held-out gain of `experiment=local`: base (step 0) vs the last step, from the benchmark's rows.csv files.

    python experiments/heldout_local/gain.py runs/heldout_local/s*/heldout/rows.csv
    python experiments/heldout_local/gain.py --versus A/rows.csv B/rows.csv

Per seed: the share of questions answered at each step and the gain, with a 95% t-interval over documents (each
document's mean over its summaries): the pairs are the documents. Over seeds: the mean gain with summrl.compare's
seeds x documents CI, which keeps the spread between training seeds (averaging each document over the seeds first,
as this script did, hid it: e39d582's seeds gained 18.6, 19.6 and 5.0 points, and the pooled t said [+9.4, +19.4]).
``--versus``: two runs (two commits at one seed) compared at their last step, A minus B, paired by document.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from scipy import stats


def per_document(frame: pd.DataFrame) -> pd.DataFrame:
    """Each document's mean score (over its summaries) at each step: documents x steps."""
    return frame.groupby(["document_id", "step"]).score.mean().unstack("step")


def gain(frame: pd.DataFrame) -> dict:
    by_doc = per_document(frame)
    base, last = by_doc.columns.min(), by_doc.columns.max()
    diff = by_doc[last] - by_doc[base]
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / len(diff) ** 0.5
    return {"documents": len(diff), "base_step": int(base), "last_step": int(last),
            "base_pct": 100 * by_doc[base].mean(), "last_pct": 100 * by_doc[last].mean(),
            "gain_pts": 100 * diff.mean(), "ci_low": 100 * (diff.mean() - half), "ci_high": 100 * (diff.mean() + half)}


def main(paths: list[str]) -> None:
    frames = []
    for path in paths:
        frame = pd.read_csv(path)
        frame = frame[frame.step.notna()].assign(source=path)
        frames.append(frame)
        print(f"{path}: " + " | ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in gain(frame).items()))
    if len(frames) > 1:
        from summrl.compare import paired

        tables = [per_document(f) for f in frames]
        docs = sorted(set.intersection(*(set(t.index) for t in tables)))
        gains = np.array([(t[t.columns.max()] - t[t.columns.min()]).loc[docs].to_numpy() for t in tables])
        result = paired(gains)  # seeds x documents
        base = np.mean([t[t.columns.min()].loc[docs].mean() for t in tables])
        last = np.mean([t[t.columns.max()].loc[docs].mean() for t in tables])
        print(f"over {len(frames)} seeds: documents {len(docs)} | base_pct {100 * base:.1f} | last_pct {100 * last:.1f} | "
              f"gain_pts {100 * result.difference:.1f} | ci_low {100 * result.low:.1f} | ci_high {100 * result.high:.1f} | "
              f"df {result.df:.1f} (seeds x documents, summrl.compare)")


def versus(path_a: str, path_b: str) -> None:
    frames = [pd.read_csv(p) for p in (path_a, path_b)]
    last = [f[f.step == f.step.max()].groupby("document_id").score.mean() for f in frames]
    diff = (last[0] - last[1]).dropna()
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / len(diff) ** 0.5
    print(f"{path_a} minus {path_b} at the last step: {100 * diff.mean():+.1f} points "
          f"[{100 * (diff.mean() - half):+.1f}, {100 * (diff.mean() + half):+.1f}] over {len(diff)} documents")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--versus"]:
        versus(*sys.argv[2:4])
    else:
        main(sys.argv[1:])
