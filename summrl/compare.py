"""How sure a val score is: 95% CIs over documents (or seeds), and paired differences between two arms.

Val passes are seeded (loop.evaluate), so two arms with the same seed score the same documents with the same
draws: the difference per document (and seed) is the comparison, and its spread is the noise it has to beat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
POWER = 0.8  # for the minimum detectable difference


@dataclass
class Interval:
    mean: float
    low: float  # nan with fewer than 2 values
    high: float
    n: int
    sd: float


def mean_ci(values) -> Interval:
    """The mean and its two-sided Student-t confidence interval."""
    values = np.asarray(list(values), dtype=float)
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan)
    mean = float(values.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, math.nan)
    sd = float(values.std(ddof=1))
    half = float(stats.t.ppf((1 + CONFIDENCE) / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd)


def min_detectable(sd: float, n: int) -> float:
    """The smallest true mean difference a paired t-test at this noise and n finds with 80% power (two-sided 5%)."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return (float(stats.t.ppf((1 + CONFIDENCE) / 2, n - 1)) + float(stats.t.ppf(POWER, n - 1))) * sd / math.sqrt(n)


def verdict(diff: Interval) -> str:
    if diff.n < 2:
        return "too few paired documents"
    if diff.low > 0:
        return "better"
    if diff.high < 0:
        return "worse"
    return "no detectable difference"


def per_doc(result: dict, metric: str, step: Optional[int] = None) -> dict[str, float]:
    """One job's per-document scores at ``step`` (default: its last val pass); {} when it recorded none."""
    history = [h for h in result.get("val_history", []) if "per_doc" in h and (step is None or h["step"] == step)]
    if not history:
        return {}
    return {doc: s[metric] for doc, s in history[-1]["per_doc"].items() if s.get(metric) is not None}


def paired_differences(arm: dict[str, dict[str, float]], baseline: dict[str, dict[str, float]]) -> list[float]:
    """arm - baseline for every (seed, document) both scored; each argument maps seed -> document -> score."""
    return [arm[seed][doc] - baseline[seed][doc]
            for seed in sorted(set(arm) & set(baseline)) for doc in sorted(set(arm[seed]) & set(baseline[seed]))]
