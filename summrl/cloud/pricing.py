"""What a cloud run costs: the one pricing module the dry run, the preflight's budget check and `summrl.sweep status`
read.

GPU $ = the hourly price x (backend.setup_minutes + trainer.max_steps x model.step_minutes): the step time is the
model preset's estimate, not a measurement. The hourly price is SkyPilot's own (its catalog, through
``Resources.get_cost`` of the launchable machines it finds), or, when the catalog can't be reached, the dated
snapshot shipped beside this module (prices.json). Judge $ = the calls the reward and the val passes make x their
tokens, priced by litellm's cost map (summrl.cost's formulas, on the shipped Repliqa sample's documents, scaled to
the run's counts). A price that can't be known is None and said so, never $0.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from summrl.config import parse_accelerators, reward_kinds
from summrl.errors import is_network

SNAPSHOT = Path(__file__).with_name("prices.json")
# Judges that run on the training machine: no calls are billed.
LOCAL_JUDGES = ("lexical", "embedded", "local")


@dataclass
class Price:
    usd_per_hour: Optional[float]  # None: no price known
    source: str  # "SkyPilot's catalog" or "the price snapshot of <date>"
    machine: str  # e.g. "H100:1 on runpod (spot)"


@functools.lru_cache(maxsize=1)
def snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


def snapshot_price(cloud: Optional[str], accelerators: str, use_spot: bool) -> Optional[float]:
    """The snapshot's cheapest price for the accelerators on ``cloud`` (any cloud it lists when None)."""
    name, count = parse_accelerators(accelerators, "accelerators")
    kind = "spot" if use_spot else "on_demand"
    prices = [row[kind] for row in snapshot()["usd_per_hour"]
              if row["accelerator"] == name and row["count"] == count and row[kind] is not None
              and (cloud is None or row["cloud"] == cloud)]
    return min(prices, default=None)


def hourly_price(infra: Optional[str], accelerators: str, use_spot: bool) -> Price:
    """The cheapest hourly price SkyPilot's catalog has for these resources, or the snapshot's when the catalog is
    out of reach (no network, or skypilot not installed)."""
    cloud = infra.split("/")[0].lower() if infra else None
    machine = f"{accelerators} on {infra or 'any infra'}{' (spot)' if use_spot else ''}"
    stale = Price(snapshot_price(cloud, accelerators, use_spot), f"the price snapshot of {snapshot()['date']}", machine)
    if cloud is None:  # SkyPilot picks among the enabled clouds at launch: priced over the ones the snapshot lists
        return stale
    try:  # callers quiet SkyPilot's catalog logs (launch.quiet_sky)
        import sky

        wanted = sky.Resources(infra=infra, accelerators=accelerators, use_spot=use_spot)
        if wanted.cloud is None:
            return stale
        found = wanted.cloud.get_feasible_launchable_resources(wanted, num_nodes=1).resources_list
        costs = [r.get_cost(3600) for r in found]
    except ImportError:
        return stale
    except Exception as e:
        if is_network(e):
            return stale
        raise
    return Price(min(costs) if costs else None, "SkyPilot's catalog" + ("" if costs else ", which does not offer it"),
                 machine)


def machine_price(backend: Any) -> Price:
    """The machine SkyPilot takes first: the cheapest candidate (failover=cheapest, any_of) or the first one
    (ordered); spot when asked (a fallback to on-demand costs more: see the README)."""
    if not backend.candidates:
        return hourly_price(backend.infra, backend.accelerators, backend.use_spot)
    prices = [hourly_price(c.infra, c.accelerators, backend.use_spot if c.use_spot is None else c.use_spot)
              for c in backend.candidates]
    if backend.failover == "ordered":
        return prices[0]
    known = [p for p in prices if p.usd_per_hour is not None]
    return min(known, key=lambda p: p.usd_per_hour) if known else prices[0]


@dataclass
class Estimate:
    """One run's estimated cost."""

    run: str
    price: Price
    hours: Optional[float]  # None: the model declares no step time
    judge: Any  # summrl.cost.Calls
    notes: list[str] = field(default_factory=list)  # what the estimate leaves out

    @property
    def gpu_usd(self) -> Optional[float]:
        if self.price.usd_per_hour is None or self.hours is None:
            return None
        return self.price.usd_per_hour * self.hours

    @property
    def judge_usd(self) -> Optional[float]:
        return self.judge.usd

    @property
    def total_usd(self) -> Optional[float]:
        parts = (self.gpu_usd, self.judge_usd)
        return None if None in parts else sum(parts)


def gpu_hours(config: Any) -> Optional[float]:
    step = config.model.step_minutes
    if step is None:
        return None
    return (config.backend.setup_minutes + config.trainer.max_steps * step) / 60


def val_passes(trainer: Any) -> int:
    """Val is scored every eval_every steps from step 0, and at the end."""
    return len(set(range(0, trainer.max_steps, trainer.eval_every)) | {trainer.max_steps})


@functools.lru_cache(maxsize=1)
def sample_documents() -> tuple:
    """The shipped Repliqa sample (Repliqa's schema and style): the documents judge calls are sized on."""
    from summrl.config import RepliqaDatasetConfig
    from summrl.data.repliqa import all_documents

    return tuple(all_documents(RepliqaDatasetConfig(files=["pkg:summrl/data/repliqa_sample.jsonl"])))


def judge_calls(config: Any) -> tuple[Any, list[str]]:
    """The judge calls of a whole run (train steps and val passes), as one summrl.cost.Calls, and what is left out."""
    from summrl.cost import Calls, Work, estimate

    judge, t = config.judge, config.trainer
    calls = Calls(f"judge {getattr(judge, 'model', judge.kind)}",
                  None if judge.kind in LOCAL_JUDGES else judge.model)
    notes = []
    kinds = reward_kinds(config.reward)
    if "rubric" in kinds and not calls.local:
        notes.append("reward=rubric's judge calls are not in the estimate")
    val_docs = config.dataset.val_size
    if not isinstance(val_docs, int):
        notes.append(f"the val passes are not in the estimate (dataset.val_size={val_docs}: a count is known "
                     "only once the documents load)")
        val_docs = 0
    if calls.local:
        return calls, notes
    docs = sample_documents()
    # (documents per pass, rollouts per document, passes, QA graded, RULER ranks): summrl.cost's per-document
    # formulas on the sample, scaled from its documents to the run's.
    passes = [(t.groups_per_step, t.rollouts_per_group, t.max_steps, "qa" in kinds, "ruler" in kinds),
              (val_docs, t.val_rollouts_per_doc, val_passes(t), True, "ruler" in kinds)]
    for n_docs, rollouts, count, qa, ruler in passes:
        if not n_docs or not (qa or ruler):
            continue
        one = Calls(calls.who, calls.price_model)
        estimate([Work(Calls("policy", None), 1, {d.id: rollouts for d in docs})], docs, one,
                 max_words=t.max_words, max_summary_tokens=t.max_summary_tokens, reward_uses_ruler=ruler,
                 qa_calls=qa)
        scale = n_docs * count / len(docs)
        calls.calls += round(one.calls * scale)
        calls.input_tokens += round(one.input_tokens * scale)
        calls.output_tokens += round(one.output_tokens * scale)
    return calls, notes


def estimate_run(config: Any) -> Estimate:
    calls, notes = judge_calls(config)
    hours = gpu_hours(config)
    if hours is None:
        notes.append(f"model={config.model.name} declares no step time (model.step_minutes), so the GPU $ is unknown")
    return Estimate(config.run.name, machine_price(config.backend), hours, calls, notes)


def usd(value: Optional[float]) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def describe(e: Estimate, config: Any) -> str:
    """One run's estimate, as the dry run and the preflight print it."""
    p, t = e.price, config.trainer
    rate = "unknown price" if p.usd_per_hour is None else f"${p.usd_per_hour:.2f}/h"
    time = ("" if e.hours is None else
            f"; {config.backend.setup_minutes:g} min setup + {t.max_steps} steps x {config.model.step_minutes:g} min "
            f"= {e.hours:.1f} h")
    judge = ("local, $0" if e.judge.local else
             f"{e.judge.calls:,} calls, ~{e.judge.input_tokens:,} input / <= {e.judge.output_tokens:,} output tokens "
             f"at litellm's prices")
    lines = [f"summrl: estimated cost of run {e.run}: {usd(e.total_usd)} = GPU {usd(e.gpu_usd)} "
             f"({p.machine} at {rate} from {p.source}{time}) + {e.judge.who} {usd(e.judge_usd)} ({judge})"]
    lines += [f"summrl:   not estimated: {n}" for n in e.notes]
    return "\n".join(lines)


def total(estimates: Sequence[Estimate]) -> Optional[float]:
    values = [e.total_usd for e in estimates]
    return None if None in values else sum(values)


def budget_problem(estimates: Sequence[Estimate], budget: Optional[float]) -> Optional[str]:
    """The preflight's line when the run (or the sweep) would cost more than backend.max_cost_usd."""
    if budget is None:
        return None
    what = f"the sweep of {len(estimates)} jobs" if len(estimates) > 1 else "this run"
    cost = total(estimates)
    if cost is None:
        return (f"backend.max_cost_usd={budget:g}: the cost of {what} can't be estimated (a price or the step time "
                "is unknown: see the estimate above); set backend.max_cost_usd=null to launch without a budget")
    if cost <= budget:
        return None
    gpu = sum(e.gpu_usd for e in estimates)
    judge = sum(e.judge_usd for e in estimates)
    return (f"backend.max_cost_usd={budget:g}: the estimated cost of {what} is ${cost:,.2f} (GPU ${gpu:,.2f} + judge "
            f"${judge:,.2f}), over the budget of ${budget:,.2f}: raise backend.max_cost_usd, or run fewer steps or jobs")
