"""How sure a val score is: 95% CIs over documents (or seeds), and paired differences between two arms.

Val passes are seeded (loop.evaluate), so two arms with the same seed score the same documents with the same
draws: the difference per (seed, document) is the comparison, and its spread is the noise it has to beat.

The differences form a crossed design, seeds × documents. Pooling them as independent pairs would overstate the
evidence: the documents of one seed share that seed's training randomness. So the mean difference's variance is
estimated with a two-way random-effects ANOVA (seed, document, residual), ``Var = σ²_seed/S + σ²_doc/D +
σ²_res/(S·D)``, each component from its mean square, and the CI uses Satterthwaite's degrees of freedom. The
seeds' part (MS_seed/n) is never taken below MS_res/n and keeps S-1 degrees of freedom; the document component is
dropped when its estimate is negative. With one seed this is the paired t-test over documents: it then speaks for these two trained
checkpoints, not for the arms' training in general.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy import optimize, stats

CONFIDENCE = 0.95
POWER = 0.8  # for the minimum detectable difference
MIN_PAIRS = 3  # fewer (seed, document) pairs than this give no verdict


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
    low, high = stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=sd / math.sqrt(n)) if sd > 0 else (mean, mean)
    return Interval(mean, float(low), float(high), n, sd)


@dataclass
class Paired:
    """Arm minus baseline over the (seed, document) pairs both scored."""

    difference: float
    low: float
    high: float
    seeds: int
    documents: int
    se: float  # the standard error of ``difference``
    df: float  # Satterthwaite's degrees of freedom
    # The share of the variance of ``difference`` from each source: training seeds, val documents, and the rest
    # (sampling noise and seed × document interaction). It says what to raise to see smaller differences.
    shares: dict[str, float] = field(default_factory=dict)

    @property
    def pairs(self) -> int:
        return self.seeds * self.documents

    @property
    def min_detectable(self) -> float:
        """The smallest true difference a two-sided 5% test finds with 80% power at this noise and size."""
        if self.pairs < 2 or not math.isfinite(self.df) or self.df <= 0:
            return math.nan
        return detectable_noncentrality(self.df) * self.se

    @property
    def p(self) -> float:
        """The two-sided p-value of "no difference" (nan where there is no noise estimate): below 0.05 exactly when
        the 95% CI excludes 0."""
        if not (self.se > 0 and math.isfinite(self.df)):
            return math.nan
        return float(2 * stats.t.sf(abs(self.difference) / self.se, self.df))

    def verdict(self, lower_is_better: bool = False, p: Optional[float] = None) -> str:
        """better, worse or no detectable difference, by ``p`` (default: this comparison's own; the report passes
        one adjusted for the other arms compared with the same baseline)."""
        if self.pairs < MIN_PAIRS:
            return "too few pairs to tell"
        if self.se == 0:  # every pair differs by the same amount: a t-interval of width 0 is no evidence
            return "no detectable difference" if self.difference == 0 else "no noise estimate"
        p = self.p if p is None else p
        if not math.isfinite(p):
            return "too few pairs to tell"
        if p >= 1 - CONFIDENCE:
            return "no detectable difference"
        return ("worse" if lower_is_better else "better") if self.difference > 0 else (
            "better" if lower_is_better else "worse")


def detectable_noncentrality(df: float) -> float:
    """The true difference, in standard errors, that a two-sided t-test at ``df`` degrees of freedom finds with
    ``POWER``: the noncentrality where P(|T'| > t crit) = POWER, T' noncentral t. The usual shortcut
    (t.975 + t.8) is close from about 5 degrees of freedom, but at 1 or 2 (two seeds) it gives 73% or 77% power:
    14.08 and 5.36 standard errors where 16.33 and 5.65 are needed."""
    crit = float(stats.t.ppf((1 + CONFIDENCE) / 2, df))

    def shortfall(nc: float) -> float:  # both tails, each as an upper tail (scipy's lower-tail cdf gives NaN at some nc)
        return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc)) - POWER

    high = crit + float(stats.t.ppf(POWER, df))
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-10))


def paired(differences: np.ndarray) -> Paired:
    """The mean of a seeds × documents matrix of (arm - baseline) differences, with its 95% CI (see the module)."""
    d = np.asarray(differences, dtype=float)
    seeds, docs = d.shape
    mean = float(d.mean()) if d.size else math.nan
    nan = Paired(mean, math.nan, math.nan, seeds, docs, math.nan, math.nan)
    if d.size < 2:
        return nan
    if seeds == 1 or docs == 1:  # one factor: the plain paired t over what varies
        values = d.ravel()
        name = "seeds" if docs == 1 else "documents"
        mean_squares = {name: (float(values.var(ddof=1)), d.size - 1)}
        coefficients, components = {name: 1.0 / d.size}, {name: float(values.var(ddof=1)) / d.size}
    else:
        row, col = d.mean(axis=1, keepdims=True), d.mean(axis=0, keepdims=True)
        n = d.size
        mean_squares = {"seeds": (docs * float(((row - mean) ** 2).sum()) / (seeds - 1), seeds - 1),
                        "documents": (seeds * float(((col - mean) ** 2).sum()) / (docs - 1), docs - 1),
                        "rest": (float(((d - row - col + mean) ** 2).sum()) / ((seeds - 1) * (docs - 1)),
                                 (seeds - 1) * (docs - 1))}
        ms_res, ms_seed = mean_squares["rest"][0], mean_squares["seeds"][0]
        # Var = σ²_seed/S + σ²_doc/D + σ²_res/n. MS_seed/n estimates the first and last together, MS_doc/n the last
        # two; the document component is dropped when its estimate (MS_doc - MS_res)/n is negative. The seeds' part
        # is never below MS_res/n, and it keeps the seeds' S-1 degrees of freedom: the seeds are what was trained.
        # (Dropping it when MS_seed < MS_res, as before, left MS_res's (S-1)(D-1): with 2 seeds the 95% CI then held
        # the true difference about 60% of the time in simulation, 89% over all.)
        if ms_seed < ms_res:
            mean_squares["seeds"] = (ms_res, seeds - 1)
        keep_documents = mean_squares["documents"][0] > ms_res
        coefficients = {"seeds": 1 / n, **({"documents": 1 / n, "rest": -1 / n} if keep_documents else {})}
        components = {"seeds": max(ms_seed - ms_res, 0.0) / n, "rest": ms_res / n}
        if keep_documents:
            components["documents"] = (mean_squares["documents"][0] - ms_res) / n
    var = sum(c * mean_squares[name][0] for name, c in coefficients.items())
    if var <= 1e-12:  # every difference equal (up to rounding): no noise to measure, so no CI
        return Paired(mean, math.nan, math.nan, seeds, docs, 0.0, math.nan, {})
    df = var**2 / sum((c * mean_squares[name][0]) ** 2 / mean_squares[name][1]
                      for name, c in coefficients.items() if c != 0)
    se = math.sqrt(var)
    half = float(stats.t.ppf((1 + CONFIDENCE) / 2, df)) * se
    return Paired(mean, mean - half, mean + half, seeds, docs, se, df,
                  {name: value / var for name, value in components.items()})


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: each p-value made comparable to 0.05 when several arms are tested against one
    baseline (five arms with no true difference got a verdict in about 1 report of 5 unadjusted). nan stays nan and
    is not counted as a test."""
    order = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))  # never below a smaller p's adjusted value
        adjusted[i] = running
    return adjusted


def advice(result: Paired) -> str:
    """What to raise to detect smaller differences, from where the noise comes from."""
    if result.se == 0:  # every pair differed by the same amount: the arms' scores moved together
        return "none: every pair differs by the same amount"
    if not result.shares:
        return ""
    biggest = max(result.shares, key=result.shares.get)
    share = f"{100 * result.shares[biggest]:.0f}% of the noise"
    if biggest == "seeds":
        return f"{share} is between training seeds: add seeds"
    if result.seeds > 1 and result.df < 4:  # the seeds' few degrees of freedom widen the CI whatever the noise's source
        return (f"{share} is {'between val documents' if biggest == 'documents' else 'sampling noise within documents'}"
                f", but {result.seeds} seeds leave the CI {result.df:.1f} degrees of freedom: add seeds first")
    if biggest == "documents" and result.seeds == 1:  # one seed: documents and sampling within them are one spread
        return ("all of the noise is between val documents and sampling within them (one seed can't tell them "
                "apart): raise dataset.val_size (VAL_SIZE) or trainer.val_rollouts_per_doc, or add seeds")
    if biggest == "documents":
        return f"{share} is between val documents: raise dataset.val_size (VAL_SIZE)"
    return f"{share} is sampling noise within documents: raise trainer.val_rollouts_per_doc or dataset.val_size"


def per_doc(result: dict, metric: str, step: Optional[int] = None) -> dict[str, float]:
    """One job's per-document scores at ``step`` (default: its last val pass); {} when it recorded none."""
    history = [h for h in result.get("val_history", []) if "per_doc" in h and (step is None or h["step"] == step)]
    if not history:
        return {}
    return {doc: s[metric] for doc, s in history[-1]["per_doc"].items()
            if s.get(metric) is not None and math.isfinite(s[metric])}


if __name__ == "__main__":  # a library: `python -m summrl.compare <folder>` printed nothing and exited 0
    raise SystemExit("summrl.compare is the statistics summrl.report uses: run python -m summrl.report <sweep folder> "
                     "(--baseline '<overrides>' for the paired comparisons)")
