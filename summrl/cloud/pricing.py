"""What a cloud run costs: the one pricing module the dry run, the preflight's budget check and `summrl.sweep status`
read.

GPU $ = the hourly price x (backend.setup_minutes + trainer.max_steps x model.step_minutes): the step time is the
model preset's estimate, not a measurement. The hourly price is SkyPilot's own (its catalog, through
``Resources.get_cost`` of the launchable machines it finds), or, when the catalog can't be reached, the dated
snapshot shipped beside this module (prices.json). Judge $ = the calls every reward makes (each term of a weighted one)
in the train steps, an SFT stage's scoring and the val passes x their tokens, priced by litellm's cost map, sized on
the shipped Repliqa sample's documents and scaled to the run's counts. A reward that calls no judge costs $0 and
says so; a price or a count that can't be known makes the $ None, said so, never $0.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from summrl.config import FREE_JUDGES, parse_accelerators
from summrl.cost import Calls, Sized, Tally, first_calls, group_calls, sized
from summrl.errors import is_network
from summrl.prompt import SummaryPrompt

SNAPSHOT = Path(__file__).with_name("prices.json")


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
    def price(infra: Optional[str], accelerators: str, use_spot: bool) -> Price:
        spot = hourly_price(infra, accelerators, use_spot)
        if use_spot and backend.spot_fallback and spot.usd_per_hour is None:  # no spot offer: on demand at once
            return hourly_price(infra, accelerators, False)
        return spot

    if not backend.candidates:
        return price(backend.infra, backend.accelerators, backend.use_spot)
    prices = [price(c.infra, c.accelerators, backend.use_spot if c.use_spot is None else c.use_spot)
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
    judge: Calls  # every judge call of the run
    notes: list[str] = field(default_factory=list)  # what the estimate leaves out, or counts as an upper bound
    judge_parts: list[str] = field(default_factory=list)  # where the judge calls come from, e.g. "train 4,400 (qa)"
    judge_unknown: list[str] = field(default_factory=list)  # why the judge $ can't be known (then it is None)
    teacher: Optional[Calls] = None  # sft=distill's teacher calls; None without one
    teacher_unknown: list[str] = field(default_factory=list)  # why the teacher $ can't be known

    @property
    def gpu_usd(self) -> Optional[float]:
        if self.price.usd_per_hour is None or self.hours is None:
            return None
        return self.price.usd_per_hour * self.hours

    @property
    def judge_usd(self) -> Optional[float]:
        return None if self.judge_unknown else self.judge.usd

    @property
    def teacher_usd(self) -> Optional[float]:
        if self.teacher is None:
            return 0.0
        return None if self.teacher_unknown else self.teacher.usd

    @property
    def total_usd(self) -> Optional[float]:
        parts = (self.gpu_usd, self.judge_usd, self.teacher_usd)
        return None if None in parts else sum(parts)


def gpu_hours(config: Any) -> Optional[float]:
    step = config.model.step_minutes
    if step is None:
        return None
    return (config.backend.setup_minutes + config.trainer.max_steps * step) / 60


def val_passes(trainer: Any, sft: bool = False) -> int:
    """Val is scored every eval_every steps from step 0, and at the end; an SFT stage adds one, after it (the loop
    scores before SFT, after it, then at the GRPO steps)."""
    return len(set(range(0, trainer.max_steps, trainer.eval_every)) | {trainer.max_steps}) + sft


@functools.lru_cache(maxsize=1)
def sample_documents() -> tuple:
    """The shipped Repliqa sample (Repliqa's schema and style): the documents judge calls are sized on."""
    from summrl.config import RepliqaDatasetConfig
    from summrl.data.repliqa import all_documents

    return tuple(all_documents(RepliqaDatasetConfig(files=["pkg:summrl/data/repliqa_sample.jsonl"])))


# --------------------------------------------------------------------------- the judge calls of a run
#
# What each reward's calls and tokens are is summrl.cost's (the cost guard's): here only how many groups and documents
# a run scores with which rewards.


@functools.lru_cache(maxsize=4)
def sized_documents(prompt: SummaryPrompt) -> tuple[Sized, ...]:
    return tuple(sized(d, prompt) for d in sample_documents())


def leaves(reward: Any) -> list[Any]:
    """The rewards that score a group: a weighted reward's terms (each scores every group), or the reward itself."""
    if reward.kind == "weighted":
        return [leaf for term in reward.terms.values() for leaf in leaves(term.reward)]
    return [reward]


def val_leaves(reward: Any) -> list[Any]:
    """What val scores with (summrl.rewards.build_val_reward): the reward, plus QA's metrics beside it unless
    exactly one of its terms is QA."""
    from summrl.config import QARewardConfig

    found = leaves(reward)
    return found if sum(r.kind == "qa" for r in found) == 1 else [*found, QARewardConfig()]


def label(rewards: Sequence[Any]) -> str:
    return " + ".join(r.kind for r in rewards)


def sft_documents(config: Any) -> Optional[int]:
    """The train documents an SFT stage collects from (sft.max_docs, or all), None when not yet countable."""
    counts = [n for n in (config.sft.max_docs, config.dataset.train_size) if isinstance(n, int)]
    return min(counts) if counts else None


def teacher_calls(config: Any) -> Optional[Calls]:
    """sft=distill: the teacher writes sft.samples_per_doc summaries per document (summrl.cost's sizing, as its own
    cost guard prints it when the run starts); None without a teacher."""
    s, t = config.sft, config.trainer
    if s.kind != "distill":
        return None
    calls = Calls(f"teacher {s.teacher.model}", s.teacher.model)
    n_docs = sft_documents(config) or 0  # None: not countable (estimate_run says so; the $ is unknown)
    docs = sized_documents(SummaryPrompt.of(t))
    calls.calls = n_docs * s.samples_per_doc
    calls.input_tokens = round(calls.calls * sum(d.prompt for d in docs) / len(docs))
    calls.output_tokens = calls.calls * t.max_summary_tokens
    return calls


def judge_calls(config: Any) -> tuple[Calls, list[str], list[str], list[str]]:
    """The judge calls of a whole run (train steps, an SFT stage's scoring, val passes), where they come from, what
    is left out, and why their $ can't be known (empty when it can)."""
    judge, t, data, s = config.judge, config.trainer, config.dataset, config.sft
    calls = Calls(f"judge {getattr(judge, 'model', judge.kind)}", None if judge.kind in FREE_JUDGES else judge.model)
    notes: list[str] = []
    unknown: list[str] = []
    if calls.local:
        return calls, [], notes, unknown
    sft_docs = sft_documents(config) if s.kind != "none" else 0
    if sft_docs is None:
        unknown.append(f"sft={s.kind} collects from every train document, and dataset.train_size={data.train_size} "
                       "is counted only once the documents load")
        sft_docs = 0
    train, val = leaves(config.reward), val_leaves(config.reward)
    unknown += [f"reward.kind={r.kind}'s judge calls are not known to the estimate"
                for r in train if r.kind not in ("qa", "ruler", "rubric", "length")]
    groups = t.max_steps * t.groups_per_step
    # Each train document is scored for the first time at most once (QA's baseline, the rubrics written).
    first_train = groups + sft_docs
    if isinstance(data.train_size, int):
        first_train = min(first_train, data.train_size)
    val_docs = data.val_size
    if not isinstance(val_docs, int):
        unknown.append(f"dataset.val_size={val_docs}: the val documents are counted only once they load")
        val_docs = None
    passes = val_passes(t, s.kind != "none")
    val_label = label(train) + (" + qa metrics" if len(val) > len(train) else "") + f", {passes} passes"
    # (part, rewards, groups, summaries per group, documents scored for the first time)
    plan = [("train", train, groups, t.rollouts_per_group, first_train),
            ("sft", train, sft_docs, s.samples_per_doc, 0),
            ("val", val, (val_docs or 0) * passes, t.val_rollouts_per_doc, val_docs or 0)]
    docs = sized_documents(SummaryPrompt.of(t))
    parts = []
    for part, rewards, n_groups, n, firsts in plan:
        if part == "sft" and s.kind == "none":
            continue
        if part == "val" and val_docs is None:
            parts.append(f"val unknown ({val_label})")
            continue
        one = Tally()  # the sample's mean per group, and per document scored for the first time
        for d in docs:
            one.plus(group_calls(rewards, d, n, t.max_summary_tokens), n_groups / len(docs))
            one.plus(first_calls(rewards, d), firsts / len(docs))
        count = one.into(calls)
        what = val_label if part == "val" else label(rewards)
        parts.append(f"{part} {count:,} ({what})" if count else f"{part} 0 ({what} calls no judge: $0)")
    if hasattr(data, "questions"):  # dataset=documents, inbox: the user's documents, maybe without questions
        notes.append(f"dataset={data.kind}: the calls are sized on Repliqa's documents, not yours, and the questions "
                     "the judge writes for documents that have none are not counted (dataset.questions.max_cost_usd "
                     "bounds them)")
    if any(r.kind == "rubric" for r in val):
        notes.append("the rubrics' writing is counted for every document (an upper bound: a dataset's own rubrics "
                     "and those in reward.cache_dir are not written again)")
    return calls, parts, notes, unknown


def estimate_run(config: Any) -> Estimate:
    calls, parts, notes, unknown = judge_calls(config)
    hours = gpu_hours(config)
    if config.sft.kind != "none":
        notes.append(f"sft={config.sft.kind}: the SFT stage's GPU time is not in the hours (no preset declares it)")
    if hours is None:
        notes.append(f"model={config.model.name} declares no step time (model.step_minutes), so the GPU $ is unknown")
    teacher = teacher_calls(config)
    teacher_unknown = []
    if teacher is not None and sft_documents(config) is None:
        teacher_unknown.append(f"sft=distill writes for every train document, and dataset.train_size="
                               f"{config.dataset.train_size} is counted only once the documents load")
    return Estimate(config.run.name, machine_price(config.backend), hours, calls, notes, parts, unknown, teacher,
                    teacher_unknown)


def usd(value: Optional[float]) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def describe(e: Estimate, config: Any) -> str:
    """One run's estimate, as the dry run and the preflight print it: the sum, then where each part comes from."""
    p, t, j, m = e.price, config.trainer, e.judge, e.teacher
    rate = "unknown price" if p.usd_per_hour is None else f"${p.usd_per_hour:.2f}/h"
    time = ("" if e.hours is None else
            f"; {config.backend.setup_minutes:g} min setup + {t.max_steps} steps x {config.model.step_minutes:g} min "
            f"= {e.hours:.1f} h")
    teacher = "" if m is None else f" + teacher {usd(e.teacher_usd)}"
    lines = [f"summrl: estimated cost of run {e.run}: {usd(e.total_usd)} = GPU {usd(e.gpu_usd)} + judge "
             f"{usd(e.judge_usd)}{teacher}",
             f"summrl:   GPU: {p.machine} at {rate} from {p.source}{time}"]
    if j.local:
        lines.append(f"summrl:   {j.who}: local, $0")
    else:
        known = ""
        if j.calls and j.usd is None:
            known = f" ({j.price_model} is not in litellm's cost map)"
        elif e.judge_unknown and j.calls:
            known = f" (${j.usd:,.2f} for these)"
        lines.append(f"summrl:   {j.who}: {j.calls:,} calls = {' + '.join(e.judge_parts)}; ~{j.input_tokens:,} input / "
                     f"<= {j.output_tokens:,} output tokens at litellm's prices{known}")
    lines += [f"summrl:   judge $ unknown: {n}" for n in e.judge_unknown]
    if m is not None:
        lines.append(f"summrl:   {m.who}: {m.calls:,} calls; ~{m.input_tokens:,} input / <= {m.output_tokens:,} "
                     "output tokens at litellm's prices"
                     + ("" if m.usd is not None or not m.calls else f" ({m.price_model} is not in litellm's cost map)"))
        lines += [f"summrl:   teacher $ unknown: {n}" for n in e.teacher_unknown]
    lines += [f"summrl:   note: {n}" for n in e.notes]
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
        return (f"backend.max_cost_usd={budget:g}: the cost of {what} can't be estimated (a price, a count or the "
                "step time is unknown: see the estimate above); set backend.max_cost_usd=null to launch without a "
                "budget")
    if cost <= budget:
        return None
    gpu = sum(e.gpu_usd for e in estimates)
    judge = sum(e.judge_usd for e in estimates)
    teacher = sum(e.teacher_usd for e in estimates)
    return (f"backend.max_cost_usd={budget:g}: the estimated cost of {what} is ${cost:,.2f} (GPU ${gpu:,.2f} + judge "
            f"${judge:,.2f}{f' + teacher ${teacher:,.2f}' if teacher else ''}), over the budget of ${budget:,.2f}: "
            "raise backend.max_cost_usd, or run fewer steps or jobs")
