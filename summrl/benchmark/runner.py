"""The benchmark, top to bottom: plan the rows still to do → cost guard → serve checkpoints if needed →
for each model (and step), summarize every val document ``rollouts_per_doc`` times, score each document's
summaries with the judge and the training reward, append the rows → summary table and charts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from summrl.benchmark.charts import bar_chart, step_chart
from summrl.benchmark.config import BenchmarkConfig, BestOfNEntry, ModelEntry
from summrl.benchmark.publish import OUTPUTS, publish
from summrl.benchmark.rows import KeptSummaries, Row, RowStore, correctness, read_rows, row_key
from summrl.backends.serving import start_server
from summrl.benchmark.sources import BestOfN, LiteLLMSource, Summary, SummaryError
from summrl.benchmark.summary import markdown, summarize
from summrl.config import (EMBEDDED_JUDGES, FREE_JUDGES, LexicalJudgeConfig, RulerRewardConfig, reward_kinds,
                           rewards_of_kind)
from summrl.cost import Calls, Work, confirmed, estimate, needs_confirmation, render, token_price
from summrl.data import Document, Question
from summrl.errors import ConfigError, first_line
from summrl.facts import hallucinates
from summrl.job import append_jsonl, jsonl_rows, write_json
from summrl.judges import build_judge, embedded_endpoint
from summrl.judges.client import REQUEST_COST, CallBudget, SpendStopped
from summrl.rewards import Missing, build_reward, check_documents
from summrl.rewards.ruler import RulerReward
from summrl.secrets import redact_text
from summrl.prompt import PROMPT_BEFORE_THE_OPTION, SummaryPrompt, word_count
from summrl.splits import load as load_documents

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One line of the summary table: a model entry, or the trained run at one step (0 = base model)."""

    label: str
    step: Optional[int]  # a checkpoint step of the trained run; None for model entries
    entry: Union[ModelEntry, BestOfNEntry, None]  # None: the trained run's checkpoint at ``step``
    pending: dict[str, list[int]] = field(default_factory=dict)  # document id -> rollouts still to do

    @property
    def serve_step(self) -> Optional[int]:
        """The checkpoint this job's summaries come from, if any."""
        if self.entry is None:
            return self.step
        return self.entry.step if isinstance(self.entry, BestOfNEntry) else None


def plan(config: BenchmarkConfig, documents: Sequence[Document], store: RowStore) -> list[Job]:
    settings = config.benchmark
    jobs = [Job(settings.run.name, step, None) for step in settings.run.steps] if settings.run else []
    jobs += [Job(entry.label, None, entry) for entry in settings.models]
    for job in jobs:
        for doc in documents:
            todo = [r for r in range(settings.rollouts_per_doc)
                    if row_key(job.label, job.step, doc.id, r) not in store.done]
            if todo:
                job.pending[doc.id] = todo
    return jobs


# ------------------------------------------------------------------ cost guard


def _uses_ruler(config: BenchmarkConfig) -> bool:
    return "ruler" in reward_kinds(config.reward)


def judge_local(config: BenchmarkConfig) -> bool:
    return config.judge.kind in FREE_JUDGES


def ruler_used(config: BenchmarkConfig, jobs: Sequence[Job]) -> bool:
    return _uses_ruler(config) or any(isinstance(j.entry, BestOfNEntry) for j in jobs)


def to_buy(job: Job, kept: Optional[KeptSummaries], candidates: int) -> Optional[dict[str, int]]:
    """Each document's model calls still to pay for: a rollout's summary, or a best-of-N candidate, kept from an
    earlier run (generated.jsonl) is scored without being bought again. None: nothing is kept."""
    if kept is None or not kept.kept:
        return None

    def calls(doc_id: str, rollout: int) -> int:
        if kept.get(job.label, job.step, doc_id, rollout) is not None:
            return 0
        if candidates == 1:
            return 1
        return sum(kept.get(job.label, job.step, doc_id, rollout, candidate=i) is None for i in range(candidates))

    return {doc_id: sum(calls(doc_id, r) for r in rollouts) for doc_id, rollouts in job.pending.items()}


def cost_plan(config: BenchmarkConfig, jobs: Sequence[Job], documents: Sequence[Document],
              kept: Optional[KeptSummaries] = None) -> list[Calls]:
    work = []
    for job in jobs:
        entry = job.entry.model if isinstance(job.entry, BestOfNEntry) else job.entry
        if entry is not None:
            calls = Calls(f"model {entry.model}", entry.model)
        else:  # served on this machine
            calls = Calls(f"model {job.label} (checkpoint step {job.serve_step})", None)
        candidates = job.entry.n if isinstance(job.entry, BestOfNEntry) else 1
        work.append(Work(calls, candidates, {d: len(r) for d, r in job.pending.items()}, to_buy(job, kept, candidates)))
    judge_id = getattr(config.judge, "model", None) or f"{config.model.base_model} (judge={config.judge.kind})"
    judge = Calls(f"judge {judge_id}", None if judge_local(config) else config.judge.model)
    llm_judge = config.judge.kind not in ("lexical", "local")
    return estimate(work, documents, judge, prompt=SummaryPrompt.of(config.trainer),
                    max_summary_tokens=config.trainer.max_summary_tokens, reward_uses_ruler=_uses_ruler(config),
                    qa_calls=llm_judge,
                    rubric_rewards=list(rewards_of_kind(config.reward, "rubric").values()) if llm_judge else [])


# ------------------------------------------------------------------ scoring


class RecordingJudge:
    """Passes calls to the judge and keeps each text's verdicts, so the per-question correctness of a row
    comes from the same judge calls as its reward (reward=qa asks nothing twice)."""

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self.verdicts: dict[str, Union[list[bool], Exception]] = {}

    def __getattr__(self, name: str) -> Any:  # .client (RULER), usage_metrics
        return getattr(self.judge, name)

    async def grade_group(self, texts: Sequence[str], questions: Sequence[Question]) -> list:
        results = await self.judge.grade_group(texts, questions)
        self.verdicts.update(zip(texts, results))
        return results

    async def grade_all(self, texts: Sequence[str], questions: Sequence[Question]) -> list:
        """Verdicts for every text; those the reward did not grade (RULER, Summary-RL's rejections) are graded now."""
        rest = [t for t in dict.fromkeys(texts) if t not in self.verdicts]
        if rest:
            await self.grade_group(rest, questions)
        return [self.verdicts[t] for t in texts]


def skip_full_document_baseline(reward: Any, document: Document) -> None:
    """The QA reward also grades the full document once per document (training's percent_full metric);
    the benchmark does not report it, so it does not pay for it: wherever a QA reward sits in ``reward`` (itself, a
    wrapper's ``base``, a weighted reward's terms, as length_penalized and qa_rubric build it)."""
    if reward is None:
        return
    if hasattr(reward, "baselines"):
        reward.baselines.setdefault(document.id, None)
    skip_full_document_baseline(getattr(reward, "base", None), document)
    for _, term in (getattr(reward, "terms", None) or {}).values():
        skip_full_document_baseline(term, document)


@dataclass
class KeptCandidates:
    """A rollout's best-of-N candidates in generated.jsonl, each kept as it comes back."""

    store: KeptSummaries
    job: Job
    document_id: str
    rollout: int

    def get(self, index: int) -> Optional[Summary]:
        record = self.store.get(self.job.label, self.job.step, self.document_id, self.rollout, candidate=index)
        return Summary.of(record) if record is not None else None

    def add(self, index: int, summary: Summary) -> None:
        self.store.add(self.job.label, self.job.step, self.document_id, self.rollout, asdict(summary), candidate=index)


@dataclass
class FailedRow:
    """A rollout that could not be made or scored (``failures.jsonl``): why, and what its calls were billed for, so
    the folder's spend counts it (the row stays undone; a rerun retries it)."""

    model: str
    step: Optional[int]
    document_id: str
    rollout: int
    error: str
    model_calls: int = 0
    model_cost_usd: float = 0.0  # nan: unknown
    judge_calls: float = 0.0
    judge_cost_usd: float = 0.0  # nan: unknown


FAILURES_FILE = "failures.jsonl"


@dataclass
class Scorer:
    config: BenchmarkConfig
    judge_config: Any  # config.judge, or its lexical half when judge=local runs no RULER (no model to serve)
    endpoint: Optional[tuple[str, str, str]]  # judge=embedded or local: (base model, URL, key)
    judge_cost_known: bool  # False: a paid judge whose price (or RULER's) cannot be counted
    kept: Optional[KeptSummaries] = None  # summaries paid for, kept until scored (a rerun scores them)

    async def summaries(self, job: Job, source: Any,
                        document: Document) -> tuple[list[int], list[Summary], list[FailedRow]]:
        """The rollouts whose summary was made now or kept from before, those summaries, and the errors of those that
        failed: one failed model call no longer throws its paid siblings away."""
        async def one(rollout: int) -> Summary:
            kept = self.kept.get(job.label, job.step, document.id, rollout) if self.kept else None
            if kept is not None:
                return Summary.of(kept)
            if isinstance(source, BestOfN):
                made = await source.summarize(document, KeptCandidates(self.kept, job, document.id, rollout)
                                              if self.kept is not None else None)
            else:
                made = await source.summarize(document)
            if self.kept is not None:
                self.kept.add(job.label, job.step, document.id, rollout, asdict(made))
            return made

        rollouts = job.pending[document.id]
        results = await asyncio.gather(*(one(r) for r in rollouts), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, SummaryError):
                raise result
        made = [(r, s) for r, s in zip(rollouts, results) if isinstance(s, Summary)]
        failed = [FailedRow(job.label, job.step, document.id, r, str(e), e.model_calls, e.model_cost_usd)
                  for r, e in zip(rollouts, results) if isinstance(e, SummaryError)]
        return [r for r, _ in made], [s for _, s in made], failed

    async def score(self, job: Job, source: Any, document: Document) -> tuple[list[Row], list[FailedRow]]:
        rollouts, summaries, failed = await self.summaries(job, source, document)
        if not rollouts:
            return [], failed
        judge = RecordingJudge(build_judge(self.judge_config, self.endpoint))  # a fresh judge: its usage is this document's
        reward = build_reward(self.config.reward, judge, SummaryPrompt.of(self.config.trainer))
        skip_full_document_baseline(reward, document)
        texts = [s.text for s in summaries]
        scores = await reward.score_group(document, texts)
        verdicts = await judge.grade_all(texts, document.questions)
        usage = judge.usage_metrics()
        calls = usage.get("judge/calls", 0.0) / len(texts)
        # a reply with no token counts was priced at $0 by litellm: unknown, as the README says, not free
        known = self.judge_cost_known and not usage.get("judge/unpriced_calls")
        judge_cost = usage.get("judge/cost_usd", 0.0) / len(texts) if known else math.nan
        rows, errors = [], list(failed)
        # the questions `score` counts: the answerable ones alone where the reward's QA term leaves the others out
        # (reward.include_unanswerable=false), as the reward does; an empty summary scored 0.2 there, by abstaining
        qa = list(rewards_of_kind(self.config.reward, "qa").values())
        counted = [q.answerable or not (len(qa) == 1 and not qa[0].include_unanswerable) for q in document.questions]
        for rollout, summary, score, verdict in zip(rollouts, summaries, scores, verdicts):
            if isinstance(score, Missing) or isinstance(verdict, Exception):  # its summary is kept: not paid again
                error = score.error if isinstance(score, Missing) else str(verdict)
                errors.append(FailedRow(job.label, job.step, document.id, rollout, redact_text(error),  # to a file
                                        judge_calls=calls, judge_cost_usd=judge_cost if calls else 0.0))
                continue
            rows.append(Row(
                model=job.label, step=job.step, document_id=document.id, rollout=rollout,
                score=(sum(v for v, c in zip(verdict, counted) if c) / sum(counted)) if any(counted) else math.nan,
                reward=score.reward, correct=correctness(verdict),
                questions=len(verdict), words=word_count(summary.text),
                hallucinated=int(hallucinates(summary.text, document.text)), chars=len(summary.text),
                model_calls=summary.model_calls, model_cost_usd=summary.model_cost_usd, judge_calls=calls,
                judge_cost_usd=judge_cost, ranking_calls=summary.ranking_calls, summary=summary.text,
            ))
        return rows, errors


# ------------------------------------------------------------------ sources


def litellm_source(config: BenchmarkConfig, entry: ModelEntry) -> LiteLLMSource:
    t, b = config.trainer, config.benchmark
    return LiteLLMSource(model=entry.model, prompt=SummaryPrompt.of(t), max_tokens=t.max_summary_tokens,
                         temperature=t.temperature, timeout_s=b.timeout_s, max_retries=b.max_retries,
                         api_base=entry.api_base, api_key_env=entry.api_key_env)


async def source_for(config: BenchmarkConfig, job: Job, server: Any, ruler_judge: Any) -> Any:
    t, b = config.trainer, config.benchmark
    step = job.serve_step
    if step is not None:
        name = await server.serve(step)
        inner = LiteLLMSource(model=f"openai/{name}", prompt=SummaryPrompt.of(t), max_tokens=t.max_summary_tokens,
                              temperature=t.temperature, timeout_s=b.timeout_s, max_retries=b.max_retries,
                              api_base=server.base_url, api_key=server.api_key, local=True,
                              extra_body=server.extra_body)
    else:
        entry = job.entry.model if isinstance(job.entry, BestOfNEntry) else job.entry
        inner = litellm_source(config, entry)
    if not isinstance(job.entry, BestOfNEntry):
        return inner

    rubric = getattr(config.reward, "rubric", None) or RulerRewardConfig().rubric
    return BestOfN(inner, job.entry.n, RulerReward(ruler_judge.client, rubric=rubric, prompt=SummaryPrompt.of(t)))


# ------------------------------------------------------------------ outputs


IDENTITY_FILE = "benchmark.json"
GENERATED_FILE = "generated.jsonl"  # summaries paid for and not yet scored (rows.KeptSummaries)
SPEND_FILE = "spend.json"  # the folder's $ so far, every invocation ({"usd": ...}; benchmark.max_cost_usd reads it)


# Settings of how rows are made, not of what they are: a folder resumes under other values of them (a longer timeout,
# a new cache folder, another budget for the questions, the key in another variable).
OPERATIONAL = {"judge": ("max_concurrency", "timeout_s", "max_retries", "retry_base_s", "retry_max_s", "cache_dir",
                         "api_key_env"),
               "reward": ("cache_dir",), "questions": ("confirm", "max_cost_usd", "cache_dir")}


def comparable(record: dict) -> dict:
    """An identity (``identity``, or a folder's ``benchmark.json``) without its operational settings."""
    out = json.loads(json.dumps(record))
    for section in ("judge", "reward"):
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in OPERATIONAL[section]}
    questions = (out.get("dataset") or {}).get("questions") if isinstance(out.get("dataset"), dict) else None
    if isinstance(questions, dict):
        out["dataset"]["questions"] = {k: v for k, v in questions.items() if k not in OPERATIONAL["questions"]}
    return out


def identity(config: BenchmarkConfig) -> dict:
    """What makes rows comparable: the same documents, prompt, sampling, judge and reward."""
    t = config.trainer
    dataset = asdict(config.dataset)
    if config.benchmark.split == "all":  # every document: the split sizes play no part
        dataset = {k: v for k, v in dataset.items() if k not in ("train_size", "val_size")} | {"split": "all"}
    elif dataset.get("val_size") != "all":  # val is the first val_size of the shuffle, whatever train_size is
        dataset.pop("train_size", None)
    judge = asdict(config.judge)
    if config.judge.kind in EMBEDDED_JUDGES:  # the policy's base model judges: another model= is another judge
        judge["policy_model"] = {"base_model": config.model.base_model, "weights": config.model.weights}
    return comparable({
        "dataset": dataset,
        "prompt": {"style": t.prompt, "max_words": t.max_words, "max_summary_tokens": t.max_summary_tokens,
                   "temperature": t.temperature},
        "judge": judge,
        "reward": asdict(config.reward),
    })


def sources(config: BenchmarkConfig) -> dict[str, dict]:
    """What each label's rows were made by: a resumed folder's rows are matched by label, so a label that now names
    another model (or another run, or another n) would have mixed its rows with the earlier ones."""
    out: dict[str, dict] = {}
    run = config.benchmark.run
    run_dir = str(Path(run.run_dir).resolve()) if run is not None else None
    for entry in config.benchmark.models:
        if isinstance(entry, BestOfNEntry):
            inner = entry.model
            out[entry.label] = {"best_of_n": entry.n, "step": entry.step,
                                "model": None if inner is None else {"model": inner.model, "api_base": inner.api_base}}
            if inner is None:  # a checkpoint's candidates: step 2 of another run is another model
                out[entry.label]["run_dir"] = run_dir
        else:
            out[entry.label] = {"model": entry.model, "api_base": entry.api_base}
    if run is not None:
        out[run.name] = {"run_dir": run_dir}
    return out


SCORED_BY = ("judge", "reward")  # the sections that score the kept summaries, and make none of them


def check_identity(out_dir: Path, config: BenchmarkConfig) -> Optional[dict]:
    """Refuses a folder whose rows were made otherwise (ConfigError). Returns what benchmark.json should now hold
    (None: it holds it already), written by ``record_identity`` once the run goes ahead: a run the cost guard stops
    leaves the folder as it was."""
    path = out_dir / IDENTITY_FILE
    mine = identity(config)  # (JSON's types, as read back from the file)
    labels = json.loads(json.dumps(sources(config)))
    if path.exists():
        saved = comparable(json.loads(path.read_text()))
        if isinstance(saved.get("judge"), dict) and "policy_model" in mine["judge"]:
            saved["judge"].setdefault("policy_model", mine["judge"]["policy_model"])  # not recorded before 2026-12-07
        if isinstance(saved.get("prompt"), dict):  # written before trainer.prompt
            saved["prompt"] = {"style": PROMPT_BEFORE_THE_OPTION, **saved["prompt"]}
        if isinstance(saved.get("dataset"), dict) and "train_size" not in mine["dataset"]:
            saved["dataset"].pop("train_size", None)  # recorded before it was left out: it plays no part in val
        # Before any row is scored, the judge and the reward may change: a judge that failed every call (a mistyped
        # api_base) was recorded at the first run, and its fix was refused, the paid summaries kept but never scored.
        rescored = [s for s in SCORED_BY if saved.get(s) != mine[s]]
        if rescored and not RowStore(out_dir / "rows.csv").done:
            saved.update({s: mine[s] for s in rescored})
        else:
            rescored = []
        for section in mine:
            if saved.get(section) != mine[section]:
                theirs, ours = saved.get(section), mine[section]
                keys = sorted(k for k in {*theirs, *ours} if theirs.get(k) != ours.get(k)) \
                    if isinstance(theirs, dict) and isinstance(ours, dict) else []
                differ = "; ".join(f"{section}.{k}: {json.dumps(theirs.get(k))} there, {json.dumps(ours.get(k))} "
                                   "here" for k in keys)
                raise ConfigError(
                    f"{out_dir} holds rows scored with another {section} ({differ or json.dumps(theirs)}); "
                    f"rerun with that config to resume, or pick a new benchmark.name")
        known = saved.get("sources", {})  # (a folder from before this record: each label is recorded from now on)
        for label, source in labels.items():
            if label in known and known[label] != source:
                raise ConfigError(f"{out_dir} holds rows labelled {label!r} made by {json.dumps(known[label])}, not "
                                  f"{json.dumps(source)}: give this one another label (its entry's label), or pick a "
                                  "new benchmark.name")
        grown = any(label not in known for label in labels)
        return {**saved, "sources": {**known, **labels}} if grown or rescored else None
    return {**mine, "sources": labels}


def record_identity(out_dir: Path, record: Optional[dict]) -> None:
    if record is not None:
        write_json(out_dir / IDENTITY_FILE, record)  # whole or not at all: a cut one would stop every resume


def write_outputs(config: BenchmarkConfig, jobs: Sequence[Job], out_dir: Path) -> Optional[Any]:
    import pandas as pd


    rows_path = out_dir / "rows.csv"
    rows = read_rows(rows_path) if rows_path.exists() else None
    wanted = {(j.label, j.step) for j in jobs}
    if rows is not None:
        rows = rows[[(m, None if pd.isna(s) else int(s)) in wanted for m, s in zip(rows.model, rows.step)]]
    if rows is None or rows.empty:  # nothing of this run's models: an earlier run's table and charts would stand
        for name in OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)
        return None
    run = config.benchmark.run
    stages = {(run.name, step): run.stage(step) for step in run.steps} if run else {}
    table = summarize(rows, order=[(j.label, j.step) for j in jobs], stages=stages)
    table = with_failed_spend(table, out_dir / FAILURES_FILE)
    table.to_csv(out_dir / "summary.csv", index=False)
    text = markdown(table)
    (out_dir / "summary.md").write_text(text)
    log.info(text)
    trained = config.benchmark.run.name if config.benchmark.run else None
    bar_chart(table, trained, out_dir / "models.png")
    if trained and (table.model == trained).any():
        step_chart(table, trained, out_dir / "steps.png")
    else:  # an earlier run's, with the trained run in it, was published as this one's
        (out_dir / "steps.png").unlink(missing_ok=True)
    return table


def with_failed_spend(table: Any, path: Path) -> Any:
    """The table with each line's failed calls (``failures.jsonl``, every run of the folder): how many, and their $
    (model and judge; nan where a price is unknown), which the $ / 1k column does not count."""
    import pandas as pd

    failed = jsonl_rows(path.read_text(encoding="utf-8", errors="replace")) if path.exists() else []
    calls, usd = [], []
    for model, step in zip(table.model, table.step):
        step = None if pd.isna(step) else int(step)
        mine = [f for f in failed if f.get("model") == model and f.get("step") == step]
        calls.append(sum((f.get("model_calls") or 0) + (f.get("judge_calls") or 0) for f in mine))
        costs = [f.get(k) for f in mine for k in ("model_cost_usd", "judge_cost_usd")]
        usd.append(math.nan if any(c is None for c in costs) else float(sum(costs)))
    return table.assign(failed_calls=calls, failed_usd=usd)


# ------------------------------------------------------------------ main


async def run(config: BenchmarkConfig, stdin=sys.stdin, rerun: str = "the same command") -> int:
    """The whole benchmark. Returns the exit status: 0, 1 (some rows failed; ``rerun`` retries them), 3 (not
    confirmed)."""
    out_dir = Path(config.benchmark.output_dir)
    identity_record = check_identity(out_dir, config)
    val = (await load_documents(config, every_document=config.benchmark.split == "all", val_only=True)).val
    check_documents(config, val)  # what the reward needs from the data (as training checks it), before any call
    store = RowStore(out_dir / "rows.csv")
    jobs = plan(config, val, store)
    total = len(jobs) * len(val) * config.benchmark.rollouts_per_doc
    todo = [j for j in jobs if j.pending]
    kept = KeptSummaries(out_dir / GENERATED_FILE)  # read once: priced by the plan, scored by the jobs
    lines = cost_plan(config, todo, val, kept)
    log.info(render(lines, total, total - sum(len(r) for j in todo for r in j.pending.values())))
    over = over_budget(config, lines, folder_spend(store)) if todo else None
    if over:
        log.error(f"summrl: not confirmed: {over}; nothing was called")
        return 3
    if todo and config.benchmark.confirm and needs_confirmation(lines) and not confirmed(stdin):
        log.error("summrl: not confirmed: benchmark: the cost was not confirmed; nothing was called "
                  "(benchmark.confirm=false skips the question)")  # the line every not-confirmed stop prints
        return 3
    record_identity(out_dir, identity_record)
    failures, unmade = await run_jobs(config, todo, val, store, kept) if todo else ([], 0)
    write_outputs(config, jobs, out_dir)
    log.info(f"summrl: benchmark output in {out_dir}")
    publish(config, out_dir)
    if failures:
        for (label, step, error), count in Counter((f.model, f.step, first_line(f.error)) for f in failures).items():
            where = "" if step is None else f" step {step}"
            log.error(f"summrl: {label}{where}: {count} x {redact_text(error)}")
        log.error(f"summrl: {len(failures)} summaries could not be made or scored (the reasons above, and in "
                  f"{FAILURES_FILE}); run {rerun} to retry only those")
    if unmade:
        budget = config.benchmark.max_cost_usd
        log.error(f"summrl: benchmark.max_cost_usd={budget:g} reached (${folder_spend(store):.4f} spent by this "
                  f"folder): {unmade} summaries not made; raise it and run {rerun} to make only those")
    return 1 if failures or unmade else 0


def folder_spend(store: RowStore) -> float:
    """What the folder's model and judge calls cost, every invocation: ``spend.json``, which counts each call as it
    returns (summaries paid for and not yet scored, and the judge's calls where a row's judge cost is unknown, are
    in it); a folder from before it, the known costs of its rows and failed calls."""
    ledger = store.path.with_name(SPEND_FILE)
    if ledger.exists():
        return float(json.loads(ledger.read_text())["usd"])

    def known(value: Any) -> float:
        try:
            usd = float(value)
        except (TypeError, ValueError):
            return 0.0
        return usd if math.isfinite(usd) else 0.0

    failed = store.path.with_name(FAILURES_FILE)
    records = [*(read_rows(store.path).to_dict("records") if store.path.exists() else []), *(
        jsonl_rows(failed.read_text(encoding="utf-8", errors="replace")) if failed.exists() else [])]
    return sum(known(r.get("model_cost_usd")) + known(r.get("judge_cost_usd")) for r in records)


def over_budget(config: BenchmarkConfig, lines: Sequence[Calls], spent: float) -> Optional[str]:
    """Why benchmark.max_cost_usd refuses the plan before any call: a price it can't count, or an estimate over it."""
    budget = config.benchmark.max_cost_usd
    if budget is None:
        return None
    setting = f"benchmark.max_cost_usd={budget:g}"
    unknown = [line.who for line in lines if line.usd is None]
    if unknown:
        return (f"{setting}: the price of {', '.join(unknown)} is unknown (not in litellm's cost map), so the spend "
                "can't be held under it: benchmark such a model without the limit (benchmark.max_cost_usd=null)")
    estimate = sum(line.usd or 0.0 for line in lines)
    if spent + estimate > budget:
        return (f"{setting}: this folder spent ${spent:.4f} and the rest is estimated at ${estimate:.4f}: raise it, or "
                "benchmark fewer models or documents")
    return None


def progress_bar(total: int) -> Any:
    """The summaries made and scored, over every model and step (tqdm; off when stderr is no terminal, or in CI)."""
    from tqdm import tqdm

    return tqdm(total=total, unit="summary", desc="summrl: benchmark", dynamic_ncols=True,
                disable=True if os.environ.get("CI") else None)


async def run_jobs(config: BenchmarkConfig, jobs: Sequence[Job], documents: Sequence[Document],
                   store: RowStore, kept: KeptSummaries) -> tuple[list[FailedRow], int]:
    """The rows' failures, and how many summaries benchmark.max_cost_usd left unmade."""
    ruler = ruler_used(config, jobs)
    needs_server = (config.judge.kind == "embedded" or (config.judge.kind == "local" and ruler)
                    or any(j.serve_step is not None for j in jobs))
    server = await start_server(config, config.benchmark.run) if needs_server else None
    try:
        judge_config = config.judge
        if config.judge.kind == "local" and not ruler:
            judge_config = LexicalJudgeConfig(min_recall=config.judge.min_recall)  # judge=local's QA grader
        endpoint = None
        if judge_config.kind in EMBEDDED_JUDGES:
            endpoint = embedded_endpoint(config, server.base_url, server.api_key)
        known = judge_local(config) or (not _uses_ruler(config) and token_price(config.judge.model, 1, 1) is not None)
        scorer = Scorer(config, judge_config, endpoint, judge_cost_known=known, kept=kept)
        ruler_judge = build_judge(judge_config, endpoint) if any(isinstance(j.entry, BestOfNEntry) for j in jobs) else None
        by_id = {d.id: d for d in documents}
        here = [0.0]  # this invocation's $ (REQUEST_COST: each judge and model call adds its own)
        spent_before, ledger = folder_spend(store), store.path.with_name(SPEND_FILE)
        budget = (CallBudget(lambda: spent_before + here[0], config.benchmark.max_cost_usd, "benchmark.max_cost_usd")
                  if config.benchmark.max_cost_usd is not None else None)
        counting = REQUEST_COST.set(here)
        unmade = 0
        failures: list[FailedRow] = []
        failed_file = store.path.with_name(FAILURES_FILE)
        progress = progress_bar(sum(len(r) for j in jobs for r in j.pending.values()))
        for job in jobs:
            source = await source_for(config, job, server, ruler_judge)
            if isinstance(job.entry, BestOfNEntry) and not judge_local(config):
                scorer_for_job = replace(scorer, judge_cost_known=False)  # RULER's cost: unreported
            else:
                scorer_for_job = scorer
            limit = asyncio.Semaphore(config.benchmark.max_concurrency)

            async def one(doc_id: str) -> int:
                nonlocal unmade
                async with limit:
                    try:  # a failed summary is among the errors score returns, never raised
                        async with budget.guard() if budget is not None else contextlib.nullcontext():
                            rows, errors = await scorer_for_job.score(job, source, by_id[doc_id])
                    except SpendStopped:  # no room for this document's calls: left for a rerun with more
                        unmade += len(job.pending[doc_id])
                        return 0
                    finally:
                        progress.update(len(job.pending[doc_id]))
                        write_json(ledger, {"usd": spent_before + here[0]})
                    store.append(rows)  # as soon as the document is scored: a crash loses only what is in flight
                    if errors:  # what they cost is the folder's spend too (unknown: null)
                        append_jsonl(failed_file, [{k: None if isinstance(v, float) and math.isnan(v) else v
                                                    for k, v in asdict(e).items()} for e in errors])
                    failures.extend(errors)
                    return len(rows)

            written = sum(await asyncio.gather(*(one(d) for d in job.pending)))
            where = "" if job.step is None else f" step {job.step} ({config.benchmark.run.stage(job.step)})"
            from tqdm.contrib.logging import logging_redirect_tqdm

            with logging_redirect_tqdm():  # into benchmark.log too, and under the bar on a terminal
                log.info(f"summrl: {job.label}{where}: {written} of {sum(len(r) for r in job.pending.values())} "
                         "summaries scored")
        progress.close()
        REQUEST_COST.reset(counting)
        return failures, unmade
    finally:
        if server is not None:
            await server.close()
