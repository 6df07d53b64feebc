"""Rubric reward (DR-Tulu's refiner recipe, for summaries): per-document positive and negative rubrics, each
scored in [0, 1]; the reward is their weighted mean with negatives flipped (1 - s), so higher is always better.

Rubrics come from the document's ``positive_rubrics`` / ``negative_rubrics`` dataset columns when it has them,
otherwise the judge writes them (:meth:`Judge.write_rubrics`: an LLM judge once per document and process, the
lexical judge offline). Rubrics a judge paid for are cached on disk, keyed by the document's hash, the writer
(judge model, endpoint, prompt version) and ``max_rubrics``, so reruns and sweeps never pay twice. The judge
scores a whole group against every rubric in one call (:meth:`Judge.score_rubrics`).

A rubric score that can't be had (the judge failed after its retries) leaves the reward missing, never 0.

``python -m summrl.data prepare`` writes a run's rubrics into that cache ahead of training (:func:`prepare`), after
the cost guard; a cloud launch carries what the cache holds for the run's judge to the cluster
(:func:`cached_files`), so that no cluster, and no job of a sweep, pays for them again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO, Union

from summrl.config import rewards_of_kind
from summrl.data import Document
from summrl.errors import ExpectedFailure
from summrl.judges.base import Judge, Rubrics
from summrl.judges.cache import JsonCache
from summrl.judges.client import JudgeError
from summrl.rewards.base import Missing, Score


class RubricCache:
    """Written rubrics on disk (:class:`summrl.judges.cache.JsonCache`), keyed by the document's hash, the writer and
    ``max_rubrics``."""

    def __init__(self, directory: str) -> None:
        self.cache = JsonCache(directory)

    def path(self, document: Document, writer: str, max_rubrics: int, new: bool = False) -> Path:
        return self.cache.document_path(document.text, writer, max_rubrics, new=new)

    def read(self, path: Path) -> Optional[Rubrics]:
        saved = self.cache.read(path) or {}
        lists = [saved.get("positive_rubrics"), saved.get("negative_rubrics")]
        if not all(isinstance(items, list) and all(isinstance(i, str) for i in items) for items in lists):
            return None
        return Rubrics(tuple(lists[0]), tuple(lists[1]))

    def write(self, path: Path, rubrics: Rubrics, **about: object) -> None:
        self.cache.write(path, {"positive_rubrics": list(rubrics.positive), "negative_rubrics": list(rubrics.negative),
                                **about})


def weighs_something(rubrics: Rubrics, positive_weight: float, negative_weight: float) -> bool:
    """Whether some rubric has a weight: otherwise the weighted mean is undefined and the document has no reward."""
    return bool(positive_weight and rubrics.positive) or bool(negative_weight and rubrics.negative)


class RubricReward:
    def __init__(self, judge: Judge, *, max_rubrics: int, positive_weight: float, negative_weight: float,
                 cache_dir: Optional[str]) -> None:
        self.judge, self.max_rubrics = judge, max_rubrics
        self.positive_weight, self.negative_weight = positive_weight, negative_weight
        self.cache = RubricCache(cache_dir) if cache_dir else None

    async def rubrics_for(self, document: Document) -> Rubrics:
        if document.positive_rubrics is not None or document.negative_rubrics is not None:
            return Rubrics(document.positive_rubrics or (), document.negative_rubrics or ())
        writer = self.judge.rubric_writer
        path = self.cache.path(document, writer, self.max_rubrics) if self.cache and writer else None
        saved = self.cache.read(path) if path else None
        if saved is not None:
            return saved
        rubrics = await self.judge.write_rubrics(document, self.max_rubrics)
        if path:
            self.cache.write(self.cache.path(document, writer, self.max_rubrics, new=True), rubrics,
                             document_id=document.id, writer=writer, max_rubrics=self.max_rubrics)
        return rubrics

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        try:
            rubrics = await self.rubrics_for(document)
            if not weighs_something(rubrics, self.positive_weight, self.negative_weight):
                # written rubrics (a dataset's are checked before training): this document has no reward
                why = (f"rubric reward, document {document.id}: its rubrics all weigh 0 (reward.positive_weight="
                       f"{self.positive_weight}, {len(rubrics.positive)} positives; reward.negative_weight="
                       f"{self.negative_weight}, {len(rubrics.negative)} negatives): raise a weight")
                return [Missing(why, "RubricsWeighNothing") for _ in summaries]
            table = await self.judge.score_rubrics(document, rubrics, summaries)
        except JudgeError as e:
            return [Missing(f"rubric reward, document {document.id}: {e}", e.kind) for _ in summaries]
        return [self._score(rubrics, row) for row in table]

    def _score(self, rubrics: Rubrics, row: list[float]) -> Score:
        positives, negatives = row[: len(rubrics.positive)], row[len(rubrics.positive):]
        # Negatives say what a summary must not do: flipped, so that 1 is always good.
        values = [*positives, *(1.0 - s for s in negatives)]
        weights = [self.positive_weight] * len(positives) + [self.negative_weight] * len(negatives)
        reward = sum(w * v for w, v in zip(weights, values)) / sum(weights)
        metrics = {}
        if positives:
            metrics["rubric_positive"] = sum(positives) / len(positives)
        if negatives:
            metrics["rubric_negative_violated"] = sum(negatives) / len(negatives)
        per_rubric = {**{f"+ {r}": s for r, s in zip(rubrics.positive, positives)},
                      **{f"- {r}": s for r, s in zip(rubrics.negative, negatives)}}
        return Score(reward, metrics, {"rubric_scores": json.dumps(per_rubric)})


# --------------------------------------------------------------------------- written ahead: summrl.data prepare


class RubricsNotConfirmed(ExpectedFailure, RuntimeError):
    """The user declined the rubric writer's estimated cost: nothing was called."""

    failure = "not_confirmed"


def cached_files(config: Any) -> list[Path]:
    """The files of the run's rubric caches (each rubric term's ``cache_dir``) that its judge wrote at the term's
    ``max_rubrics``: what a cloud job would otherwise write again. Empty for a judge that writes offline (lexical,
    local) or on the embedded backend, and for a term that caches nothing."""
    writer = writer_of(config)
    if writer is None:
        return []
    files = []
    for reward in rewards_of_kind(config.reward, "rubric").values():
        if not reward.cache_dir:
            continue
        cache = JsonCache(reward.cache_dir)
        for path in sorted(cache.directory.glob("*.json")) if cache.directory.is_dir() else ():
            saved = cache.read(path) or {}
            if saved.get("writer") == writer and saved.get("max_rubrics") == reward.max_rubrics:
                files.append(path)
    return sorted(set(files))


def writer_of(config: Any) -> Optional[str]:
    """Who writes the run's rubrics, as the cache keys them; None where nothing is cached (an offline writer) or the
    writer is the embedded backend's model (it exists only in the training process)."""
    if config.judge.kind != "litellm":
        return None
    from summrl.judges import build_judge

    return build_judge(config.judge).rubric_writer  # no call, and no key read


@dataclass
class Plan:
    """One rubric term's rubrics still to write for a set of documents, and what writing them would call."""

    key: str  # the term's settings' path: reward, or reward.terms.<name>
    reward: RubricReward
    documents: int  # the documents asked about
    given: int  # those that bring the dataset's own rubrics
    pending: list[Document]  # those whose rubrics are not cached yet
    calls: Any  # summrl.cost.Calls

    def line(self) -> str:
        cached = self.documents - self.given - len(self.pending)
        return (f"summrl: rubrics ({self.key}, max_rubrics={self.reward.max_rubrics}): {len(self.pending)} documents to "
                f"write rubrics for ({cached} cached in {self.reward.cache.cache.directory}"
                + (f", {self.given} bring their own" if self.given else "") + ")"
                + (f": {self.calls.line()}" if self.pending else ": nothing to write"))


def plans(config: Any, documents: Sequence[Document]) -> tuple[list[Plan], list[str]]:
    """What ``summrl.data prepare`` would write for each rubric term (calls nothing), and why a term, or the judge,
    has nothing to prepare."""
    from summrl.cost import Calls, first_calls, sized
    from summrl.prompt import SummaryPrompt
    from summrl.judges import build_judge

    terms = rewards_of_kind(config.reward, "rubric")
    if not terms:
        return [], []
    if config.judge.kind != "litellm":
        where = ("offline, in no time" if config.judge.kind in ("lexical", "local")
                 else "by the embedded backend's model, during training")
        return [], [f"summrl: rubrics: judge={config.judge.kind} writes them {where}: nothing to prepare"]
    judge = build_judge(config.judge)
    own = [d for d in documents if d.positive_rubrics is None and d.negative_rubrics is None]
    found, notes = [], []
    for key, term in terms.items():
        if not term.cache_dir:
            notes.append(f"summrl: rubrics: {key}.cache_dir=null keeps none, so training would write them again: "
                         f"nothing to prepare (set {key}.cache_dir to keep them)")
            continue
        reward = RubricReward(judge, max_rubrics=term.max_rubrics, positive_weight=term.positive_weight,
                              negative_weight=term.negative_weight, cache_dir=term.cache_dir)
        cache = reward.cache
        pending = [d for d in own if cache.read(cache.path(d, judge.rubric_writer, term.max_rubrics)) is None]
        calls = Calls(f"judge {judge.client.model}", judge.client.model)
        for document in pending:
            first_calls([term], sized(document, SummaryPrompt.of(config.trainer))).into(calls)
        found.append(Plan(key, reward, len(documents), len(documents) - len(own), pending, calls))
    return found, notes


async def prepare(config: Any, documents: Sequence[Document], stdin: Optional[TextIO] = None) -> None:
    """``summrl.data prepare``: each rubric term's rubrics for ``documents`` (those without the dataset's own),
    written into its cache now, after the estimate and a question (y/N). Raises RubricsNotConfirmed, JudgeError."""
    from summrl.cost import confirmed

    found, notes = plans(config, documents)
    for note in notes:
        print(note)
    for plan in found:
        print(plan.line())
        if not plan.pending:
            continue
        if not confirmed(stdin or sys.stdin):
            raise RubricsNotConfirmed("rubrics: the rubric writer's cost was not confirmed; nothing was called")
        pending = plan.pending
        results = await asyncio.gather(*(plan.reward.rubrics_for(d) for d in pending), return_exceptions=True)
        failed = [(d.id, r) for d, r in zip(pending, results) if isinstance(r, BaseException)]
        if failed:
            first_id, error = failed[0]
            if not isinstance(error, JudgeError):
                raise error
            raise JudgeError(f"rubrics could not be written for {len(failed)} of {len(pending)} documents (document "
                             f"{first_id}: {error}); the {len(pending) - len(failed)} written are cached: rerun to write "
                             "the rest", error.kind)
        # this term's own calls: every term shares one judge, whose counts went on from the term before
        spent = plan.reward.judge.client.usage.snapshot_and_reset()
        print(f"summrl: rubrics: {len(pending)} documents' rubrics written into {plan.reward.cache.cache.directory}; "
              f"judge cost ${spent['judge/cost_usd']:.4f} in {spent['judge/calls']:.0f} calls")
