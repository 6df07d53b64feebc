"""The training loop: rollouts → group rewards → ``backend.train`` → ``model.log``, with val every N steps.

Reads top to bottom. Each stage hands the next a plain value; nothing here knows which backend
or which reward it runs with.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import random
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import art
import numpy as np
import torch
from art.utils.get_model_step import get_step_from_dir
from art.utils.iterate_dataset import iterate_dataset

from summrl import algorithm, inbox, sft
from summrl.backends import art_dir, build_backend, internal_config, takes_burst_tags
from summrl.backends.art_model import TrainableModel
from summrl.config import EMBEDDED_JUDGES, OPERATIONAL, Config, reward_kinds
from summrl.data import Document
from summrl.errors import ConfigError, finish_despite_a_signal, stop_signal
from summrl.facts import hallucinates
from summrl.job import (JobInfo, RunRecord, append_jsonl, comparable, jsonl_rows, peak_rss_gb, scale_settings,
                        val_qa_settings, val_sampling)
from summrl.judges import Judge, build_judge, embedded_endpoint
from summrl.missing_rewards import MissingRewards, MissingRewardsError  # noqa: F401  (the error is raised from here)
from summrl.prompt import SummaryPrompt
from summrl.rewards import Missing, Reward, Score, build_reward, build_val_reward, check_documents
from summrl.rollout import Burst, check_context, check_packing, in_request_order, rollout, sample_seed, summary_of
from summrl.secrets import redact_text
from summrl.splits import Splits, val_digest
from summrl.splits import load as load_documents
from summrl.storage import CheckpointBackup, StorageError, keep_trained_config, latest_local_step, model_dir
from summrl.tracking import Tracker, flat_config, open_tracker

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Session:
    """What a step needs: the registered model, its backend, the reward and the sampling settings."""

    config: Config
    backend: art.Backend
    model: art.TrainableModel
    judge: Judge
    reward: Reward
    val_reward: Reward  # the reward, plus QA metrics when it is not QA-based: ablations share one axis
    tracker: Tracker
    judge_totals: dict[str, float] = field(default_factory=dict)  # the run's judge calls, tokens and cost
    missing: Optional[MissingRewards] = None  # the run's missing rewards and their limit
    tag_bursts: bool = False  # send each pass's rollouts as one Burst (backends.takes_burst_tags)
    stopping: bool = False  # Ctrl-C or SIGTERM came while an update ran: the loop stops once its step is recorded

    def __post_init__(self) -> None:
        if self.missing is None:
            self.missing = MissingRewards(self.trainer.missing_reward_window, self.trainer.max_missing_reward_rate)

    @property
    def trainer(self):
        return self.config.trainer

    def judge_usage(self) -> dict[str, float]:
        """The judge's usage since the last call (``judge/*``), also added to the run's totals."""
        usage = self.judge.usage_metrics()
        for key, value in usage.items():
            self.judge_totals[key] = self.judge_totals.get(key, 0.0) + value
        return usage


@dataclass
class Scored:
    groups: list[art.TrajectoryGroup]
    dropped_groups: int = 0
    missing_rewards: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        return {
            "judge/failed_rollouts": float(self.missing_rewards),
            "judge/dropped_groups": float(self.dropped_groups),
            **{f"time/{k}": v for k, v in self.timings.items()},
        }

    def mean_reward(self) -> float:
        rewards = [t.reward for g in self.groups for t in g.trajectories]
        return float(np.mean(rewards)) if rewards else float("nan")

    def mean_metric(self, name: str) -> Optional[float]:
        values = [t.metrics[name] for g in self.groups for t in g.trajectories if name in t.metrics]
        return float(np.mean(values)) if values else None

    def per_doc(self) -> dict[str, dict[str, Optional[float]]]:
        """Each scored document's ``n`` scored summaries and their mean reward, QA accuracy and hallucination rate
        (None when not measured). ``n`` below the val samples per document means some rewards were missing."""
        out = {}
        for group in self.groups:
            trajectories = group.trajectories
            means = {name: [t.metrics[name] for t in trajectories if name in t.metrics]
                     for name in ("qa_accuracy", "hallucination_rate")}
            out[str(trajectories[0].metadata["document_id"])] = {
                "n": len(trajectories),
                "reward": float(np.mean([t.reward for t in trajectories])),
                **{name: float(np.mean(values)) if values else None for name, values in means.items()},
            }
        return out


def history_path(config: Config) -> Path:
    """ART's metrics log for this run (``model.log`` appends one line per call)."""
    return model_dir(config) / "history.jsonl"


def end_cut_line(history: Path) -> None:
    """ART appends to history.jsonl without looking at its end: after a write a crash cut short, its next row joined
    the cut one on a line no reader parses, and was lost to history.jsonl and W&B. A fresh line starts after it."""
    if history.is_file():
        append_jsonl(history, [])


def trainable_model(config: Config) -> TrainableModel:
    return TrainableModel(
        name=config.run.name,
        project=config.project,
        base_model=config.model.base_model,
        report_metrics=[],  # ART writes history.jsonl only; logger=wandb mirrors it into one W&B run per job
        # history.jsonl and trajectories in the run folder: LocalBackend sets this itself, ServerlessBackend does not
        # (its model wrote them under ./.art, where the W&B mirror and summrl.report never looked)
        base_path=art_dir(config.run.dir),
        _internal_config=internal_config(config),  # backend=local_gpu: vLLM engine args, Unsloth, LoRA shape
    )


async def open_session(config: Config, tracker: Optional[Tracker] = None) -> Session:
    """Build the backend, register the ART model (loading or resuming it), then the judge and reward."""
    backend = build_backend(config, config.run.dir)
    model = trainable_model(config)
    try:
        await model.register(backend)
        # judge=embedded: the same endpoint, base weights (the base model's name selects no LoRA)
        endpoint = embedded_endpoint(config, model.inference_base_url, model.inference_api_key)
        judge = build_judge(config.judge, endpoint if config.judge.kind in EMBEDDED_JUDGES else None)
        reward = build_reward(config.reward, judge, SummaryPrompt.of(config.trainer))
        val_reward = build_val_reward(config, judge)
    except BaseException:
        await backend.close()
        raise
    return Session(config=config, backend=backend, model=model, judge=judge, reward=reward, val_reward=val_reward,
                   tracker=tracker or Tracker(), tag_bursts=takes_burst_tags(config))


def scored_groups(groups: Sequence[art.TrajectoryGroup], all_scores: Sequence[Sequence[Union[Score, Missing]]],
                  min_scored: int) -> tuple[list[art.TrajectoryGroup], int, int]:
    """Each group's scored rollouts, as a group of their own: (groups kept, groups dropped, rollouts missing).

    A missing reward is not a zero: its rollout is left out, never scored. The rest of its group keeps
    its scores. GRPO's advantage is a rollout's reward against its group's mean, and the rollouts of a
    group are independent samples for the same document, so the scored rest of a group is still a fair
    (smaller) group: a judge fault does not depend on the summary. Training needs ``min_scored=2`` of them
    to compare (one alone has no advantage); a rest whose rewards are all equal is kept like any such group
    (ART gives it no gradient). Val passes ``min_scored=1``: every scored summary counts in its mean.
    """
    kept, dropped, missing = [], 0, 0
    for group, scores in zip(groups, all_scores):
        trajectories = []
        for trajectory, score in zip(group.trajectories, scores):
            if isinstance(score, Missing):
                missing += 1
                continue
            trajectory.reward = score.reward
            trajectory.metrics.update(score.metrics)
            trajectory.metadata.update(score.metadata)
            trajectories.append(trajectory)
        if len(trajectories) < min_scored:
            dropped += 1
        elif len(trajectories) == len(group.trajectories):
            kept.append(group)
        else:
            kept.append(art.TrajectoryGroup(trajectories, exceptions=[]))
    return kept, dropped, missing


async def sample_and_score(session: Session, documents: Sequence[Document], rollouts_per_doc: int,
                           reward: Reward, min_scored: int = 2, temperature: Optional[float] = None,
                           seed_key: Optional[tuple] = None) -> Scored:
    """Sample ``rollouts_per_doc`` summaries per document and score each group with ``reward``.

    ``min_scored``: a group needs this many scored rollouts to be kept (see ``scored_groups``).
    ``seed_key``: summary i of a document is sampled with seed ``sample_seed(*seed_key, document id, i)``,
    so the same weights give the same summaries in every run and every arm of a sweep (the batcher waits for the whole
    Burst and makes the same generate calls from the same requests, and ``in_request_order`` keeps each group in the
    order asked; README "What a seed fixes"). None: unseeded.
    ``temperature``: None = trainer.temperature.
    Raises MissingRewardsError when the run's recent rollouts have too many missing rewards.
    """
    t = session.trainer
    temperature = t.temperature if temperature is None else temperature
    started = time.perf_counter()
    burst = Burst.new(len(documents) * rollouts_per_doc) if session.tag_bursts else None
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                rollout(session.model, doc, prompt=SummaryPrompt.of(t), max_tokens=t.max_summary_tokens,
                        temperature=temperature, seed=None if seed_key is None else sample_seed(*seed_key, doc.id, i),
                        sample=i, burst=burst)
                for i in range(rollouts_per_doc)
            )
            for doc in documents
        ),
        pbar_desc=None,
    )
    groups = in_request_order(groups)
    generated = time.perf_counter()
    by_id = {doc.id: doc for doc in documents}
    all_scores = await asyncio.gather(*(
        reward.score_group(by_id[str(g.trajectories[0].metadata["document_id"])], [summary_of(tr) for tr in g.trajectories])
        for g in groups
    ))
    for scores in all_scores:
        session.missing.add(scores)  # type: ignore[union-attr]
    session.missing.check(session.config.judge)  # type: ignore[union-attr]
    kept, dropped, missing = scored_groups(groups, all_scores, min_scored)
    scored = time.perf_counter()
    return Scored(kept, dropped, missing, {"generate_s": generated - started, "score_s": scored - generated})


def mark_hallucinations(groups: Sequence[art.TrajectoryGroup], documents: Sequence[Document]) -> None:
    """Each val summary's ``hallucination_rate`` metric: 1 when it states a number, date or proper name absent from
    its document (logged as ``val/hallucination_rate``, the share of such summaries), whatever the reward."""
    by_id = {doc.id: doc for doc in documents}
    for group in groups:
        for trajectory in group.trajectories:
            document = by_id[str(trajectory.metadata["document_id"])]
            trajectory.metrics["hallucination_rate"] = float(hallucinates(summary_of(trajectory), document.text))


async def evaluate(session: Session, val: Sequence[Document], step: int) -> dict:
    """Score the val split, each summary sampled with a seed of its own (see ``sample_and_score``).

    Returns ``{"step", "val_reward", "val_qa_accuracy", "val_hallucination_rate", "per_doc"}``: val_qa_accuracy is
    None without QA; per_doc maps each document id to its mean ``reward`` and ``qa_accuracy`` (paired comparisons
    read it).
    """
    t = session.trainer
    # Seeded by (run seed, document, sample index) only: every arm of a sweep and every step sample the same
    # way, so that differences between them come from the weights, not from the draw.
    result = await sample_and_score(session, val, t.val_rollouts_per_doc, session.val_reward, min_scored=1,
                                    temperature=t.val_temperature, seed_key=(session.config.seed,))
    mark_hallucinations(result.groups, val)
    per_doc = result.per_doc()
    doc_metrics = {f"doc/{doc}/{key}": value for doc, scores in per_doc.items()
                   for key, value in scores.items() if value is not None and key != "n"}
    await session.model.log(result.groups, split="val", step=step,
                            metrics={**result.metrics(), **session.judge_usage(), **doc_metrics})
    session.tracker.log_history()
    session.tracker.log_samples(step, result.groups)
    scores = {"step": step, "val_reward": result.mean_reward(), "val_qa_accuracy": result.mean_metric("qa_accuracy"),
              "val_hallucination_rate": result.mean_metric("hallucination_rate"), "per_doc": per_doc,
              **({"val_set": key} if (key := val_set(session.config, val)) else {})}
    accuracy = "" if scores["val_qa_accuracy"] is None else f" | val qa accuracy {scores['val_qa_accuracy']:.3f}"
    invented = ("" if scores["val_hallucination_rate"] is None
                else f" | val hallucination rate {scores['val_hallucination_rate']:.3f}")
    log.info(f"summrl: step {step} | val reward {scores['val_reward']:.3f}{accuracy}{invented}")
    return scores


async def train_step(session: Session, documents: Sequence[Document], step: int) -> tuple[Scored, art.TrainResult]:
    """Sample, score and train step ``step`` (0-based), with the algorithm's settings and scheduled learning rate."""
    # Seeded per step (a fresh draw each step, distinct within a group): a repeated or resumed run trains the same way.
    scored = await sample_and_score(session, documents, session.trainer.rollouts_per_group, session.reward,
                                    seed_key=(session.config.seed, "train", step))
    started = time.perf_counter()
    config = session.config
    # ART's packing shuffles the completions and rows with the global random (LoRA dropout draws from torch's): seeded
    # from the step, so a resumed run trains step k as the uninterrupted one did. The state was what the steps before
    # it in this process had left (seeded once, at an epoch's start), and a resume's update differed.
    seed_everything(sample_seed(config.seed, "update", step))
    lr = algorithm.learning_rate(config.algorithm, config.model.lr, step, config.trainer.max_steps)
    # Ctrl-C or SIGTERM: the update is finished and recorded, and the caller stops after it
    result, stopped = await finish_despite_a_signal(lambda: session.backend.train(
        session.model, scored.groups, learning_rate=lr, **algorithm.train_kwargs(config.algorithm, config.backend.kind)),
        "this step's update and checkpoint", "the step")
    session.stopping = session.stopping or stopped
    result.metrics.setdefault("loss/learning_rate", lr)  # ART's key; set for a backend (or step) that reports none
    scored.timings["train_s"] = time.perf_counter() - started
    return scored, result


def training_batches(train_docs: Sequence[Document], trainer, seed: int, initial_step: int):
    """The step-by-step document batches. Same seed, same order; a resumed run continues the same order.

    ART's iterate_dataset reseeds the global ``random`` with the epoch number, so the training seed
    would not reach the data order: shuffle with it first.
    """
    docs = list(train_docs)
    random.Random(seed).shuffle(docs)
    return iterate_dataset(docs, trainer.groups_per_step, trainer.num_epochs, initial_step=initial_step, use_tqdm=False)


def unrecorded_checkpoint(config: Config, step: int) -> Optional[str]:
    """What a resume from checkpoint ``step`` lacks when a kill -9 (or a lost machine) came between the checkpoint's
    write and the step's record: its training row (and so W&B's) and rollouts; its judge spend was never counted."""
    path = history_path(config)
    if step <= 0 or not path.is_file():
        return None
    if any(row.get("training_step") == step and any(k.startswith("train/") for k in row)
           for row in jsonl_rows(path.read_text())):
        return None
    return (f"summrl: warning: checkpoint {step} has no training row in {path}: the run was killed after writing it and "
            "before recording it, so that step's metrics, rollouts and judge spend are not in history.jsonl, W&B or "
            "result.json; the run goes on from it")


def check_groups_fit(config: Config, n_train: int, earlier: Optional[dict] = None) -> None:
    """A step's groups are distinct train documents: more than there are trained fewer groups (ART's batches are
    clipped to the split) while result.json and W&B said trainer.groups_per_step, so arms compared at other train
    sizes differed in their real batch size."""
    t = config.trainer
    if config.dataset.kind != "inbox" and 0 < n_train < t.groups_per_step:
        trained = (earlier or {}).get("config") or {}
        if (earlier or {}).get("attempts") and trained.get("trainer.groups_per_step") == t.groups_per_step:
            # a run an earlier summrl trained so: its resume must keep the setting (check_resumed_as_trained)
            log.warning(f"summrl: warning: trainer.groups_per_step={t.groups_per_step} is more than the {n_train} "
                        f"train document(s): each step trains {n_train} group(s), as this run did before")
            return
        raise ConfigError(f"trainer.groups_per_step={t.groups_per_step}: the train split has {n_train} document(s), "
                          f"so a step would train {n_train} group(s): set trainer.groups_per_step={n_train} or less, or "
                          "raise dataset.train_size")


def check_same_val(config: Config, earlier: dict, digest: Optional[str]) -> None:
    """A resumed run scores the val documents its earlier invocations did (``digest``: splits.val_digest of the val
    split, before the question check): a folder of documents that changed (one added or removed reshuffles the
    split) went on, and its best_val_score ranked scores of other documents."""
    trained = (earlier.get("dataset") or {}).get("val_sha256")
    if config.dataset.kind == "inbox" or not trained or not (earlier.get("attempts") or earlier.get("val_history")):
        return  # online learning has its own val; a run recorded before the digest was kept
    if digest != trained:
        where = (f"the documents in dataset.path={config.dataset.path}" if config.dataset.kind == "documents"
                 else f"dataset {config.dataset.name}'s documents")
        raise ConfigError(f"run.name={config.run.name} resumes a run whose val documents were others: {where} "
                          "changed since it trained (a document added, removed or edited moves documents between val "
                          "and train, and so does another dataset.train_size where dataset.val_size=all), so its val "
                          "scores would be ranked with scores of other documents. Restore the documents and sizes it "
                          "trained with, or give this run a new run.name")


def warn_short_run(config: Config, n_train: int) -> None:
    """trainer.num_epochs passes over the train split end a run before trainer.max_steps when they have fewer batches;
    the run still says "completed", and a learning-rate schedule (spread over max_steps) never finishes its decay."""
    t = config.trainer
    steps = math.ceil(n_train / t.groups_per_step) * t.num_epochs
    if config.dataset.kind != "inbox" and 0 < steps < t.max_steps:
        log.warning(f"summrl: {n_train} train documents at trainer.groups_per_step={t.groups_per_step} for "
                    f"trainer.num_epochs={t.num_epochs} make {steps} steps: the run ends there, before "
                    f"trainer.max_steps={t.max_steps} (raise trainer.num_epochs or the train size)")


async def sft_stage(session: Session, val: Sequence[Document], train_docs: Sequence[Document], history: list[dict],
                    step: int, backup: CheckpointBackup, save_progress) -> tuple[int, dict]:
    """The SFT warm start, recorded like val passes: val before, SFT (its checkpoint is the next step), val after.
    Returns the step GRPO continues from and result.json's ``sft`` record. A resumed run never redoes SFT."""
    config = session.config
    record = sft.saved_record(config)  # written as soon as SFT has trained
    if not record and step == 1 and any(h.get("stage") == "before_sft" for h in history):
        record = sft.record_after_stop(config, step)  # this run's step 1 is SFT's: only its record was missing
    if not record:
        if not scored_at(history, 0):
            history.append({**await evaluate(session, val, 0), "stage": "before_sft"})
            save_progress()
        try:
            record = await sft.warm_start(config, session.model, session.reward, train_docs, backup)
        except sft.SFTStopped as stopped:  # its checkpoint recorded: the run stops after it (train)
            record, session.stopping = stopped.record, True
        step = record["step"]
        await backup.after_step(step)
    if step == record["step"] and not scored_at(history, step) and not session.stopping:  # the SFT checkpoint's own
        history.append({**await evaluate(session, val, step), "stage": "after_sft"})
        save_progress()
    by_step = {h["step"]: h for h in history}
    return step, {**record, "val_before": by_step.get(0), "val_after": by_step.get(record["step"])}


async def online_documents(config: Config, splits: Splits) -> tuple[Splits, Optional[inbox.Online]]:
    """dataset=inbox: the recorded documents the run has not trained on at its latest checkpoint. With fewer than
    trainer.min_new_documents, it reads the inbox again every few seconds for up to trainer.wait_for_documents_s."""
    if config.dataset.kind != "inbox":
        return splits, None
    t = config.trainer
    if get_step_from_dir(str(model_dir(config))) == 0 and not inbox.inbox_dir(config.run.dir).is_dir():
        # nothing trained or recorded under this name: a mistyped run.name would otherwise wait for nothing
        raise ConfigError(f"dataset=inbox: run.name={config.run.name} has no checkpoint and no inbox "
                          f"({inbox.inbox_dir(config.run.dir)}): name the run that python -m summrl.serve records "
                          "for (serve.record=true), e.g. run.name=local1 for runs/local1")
    deadline = time.monotonic() + t.wait_for_documents_s
    said = False
    while True:
        step = get_step_from_dir(str(model_dir(config)))  # the checkpoint the backend will resume from
        online = inbox.online(config.run.dir, step, splits.train, splits.lines or {}, {d.id for d in splits.val},
                              config.dataset.val_size)
        remaining = deadline - time.monotonic()
        if (len(online.new) >= t.min_new_documents and splits.val) or remaining <= 0:
            return splits, online
        if not said:
            log.info(f"summrl: inbox: {len(online.new)} new document(s), fewer than trainer.min_new_documents="
                     f"{t.min_new_documents}: waiting up to {remaining:.0f} s for more (Ctrl-C stops it, training "
                     "nothing)")
            said = True
        await asyncio.sleep(min(5.0, remaining))
        # the questions written before the wait, paid for, are read from the cache at $0 now
        splits = carry_question_cost(await load_documents(config), splits)


def nothing_learned(config: Config, steps: list[int], reward: Optional[str] = None) -> str:
    """Why a run whose every step trained no group learned nothing, and what to change. ``reward``: the reward group's
    option as chosen (reward=length_penalized is a weighted reward by then, and was named reward=weighted)."""
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    if "ruler" in reward_kinds(config.reward) and config.judge.kind in ("local", "embedded"):
        why = (f"judge={config.judge.kind}'s embedded model gave every summary of a group the same RULER score; "
               "RULER needs a judge that can rank: a hosted one (judge=gemini_flash) or an instruct model of a few "
               "billion parameters behind judge=openai_compatible")
    else:
        why = (f"reward={reward or config.reward.kind} gave every summary of a group the same reward; it needs "
               "summaries that differ (trainer.temperature > 0) and a reward that tells them apart")
    return (f"summrl: {span} trained nothing (the LoRA is as it was before; result.json untrained_steps): GRPO learns "
            f"from differences within a group, and {why}")


def best_by(config: Config) -> str:
    """The val figure step=best (serve, export, benchmark) ranks checkpoints by: the val reward, except where RULER
    scores it, whose scores compare only within one group (a pass's mean is the same whatever the checkpoint): QA
    accuracy, which every RULER run measures beside it."""
    return "val_qa_accuracy" if "ruler" in reward_kinds(config.reward) else "val_reward"


def val_summary(history: list[dict]) -> dict:
    """result.json's val figures from the val history: the last pass's, and the best of those comparable to it."""
    scored = comparable(history)
    return dict(
        final_val_score=history[-1]["val_reward"],
        best_val_score=max(h["val_reward"] for h in scored),
        # the share of questions answered: the axis every reward is compared on
        final_val_qa_accuracy=history[-1]["val_qa_accuracy"],
        best_val_qa_accuracy=max((h["val_qa_accuracy"] for h in scored if h["val_qa_accuracy"] is not None),
                                 default=None),
        # the share of val summaries stating a number, date or name absent from the document (None: not recorded)
        final_val_hallucination_rate=history[-1].get("val_hallucination_rate"),
    )


def val_set(config: Config, val: Sequence[Document]) -> Optional[str]:
    """What an online run's val scores are measured on: ``inbox:<reward>:<digest>``, the digest of its val documents
    (ids and texts) and of every setting the scores depend on, as the report counts them (summrl.job.scale_settings:
    the judge's, the reward's but the operational ones, val QA's rules, the word limit and prompt where the reward
    reads them); None: the run's val split, as every other run measures it. An inbox rotated (its watermark deleted: other val documents) or another judge or reward setting is
    another val set: its scores don't compare with the earlier ones (step=best, best_val_score), and the checkpoint the
    run starts from is scored on it again. (Records from before the digest have ``inbox:<reward>``.)"""
    if config.dataset.kind != "inbox":
        return None
    flat = flat_config(config, JobInfo())  # as result.json records it, and the report compares it
    settings = json.dumps({**scale_settings(flat, "reward"), **scale_settings(flat, "qa_accuracy")}, sort_keys=True)
    digest = hashlib.sha256(f"{val_digest(val)}\0{settings}".encode()).hexdigest()[:16]
    return f"inbox:{config.reward.kind}:{digest}"


def scored_at(history: list[dict], step: int, key: Optional[str] = None) -> bool:
    return any(h["step"] == step and h.get("val_set") == key for h in history)


def check_reference(config: Config, step: int) -> None:
    """The KL reference checkpoint must be saved by the time GRPO trains: ``step`` is the run's latest checkpoint, and
    an SFT stage still to run saves step 1. Checked before the model loads; on the embedded backend it failed at the
    first update, and ART's LocalBackend fails there without naming the setting."""
    reference = config.algorithm.kl_penalty_reference_step
    start = max(step, 1) if config.sft.kind != "none" else step
    if reference and reference > start:
        raise ConfigError(f"algorithm.kl_penalty_reference_step={reference}: this run's checkpoints end at step "
                          f"{start} when GRPO starts, so checkpoint {reference} does not exist yet; name a step "
                          "already saved (1 for the SFT checkpoint of sft=best_of_n or distill), or null (or 0) for "
                          "the base model")


def run_totals(session: Session, record: RunRecord) -> dict[str, Any]:
    """The run's judge calls, $ and retries and its rollouts scored and missing: its earlier invocations' (a resumed
    or recovered run) plus this one's (the judge's up to its last ``judge_usage``). ``judge_unpriced_calls``: replies
    that came without token counts, whose $ is unknown (litellm priced them at $0, and so did this record)."""
    totals: dict[str, Any] = {f"judge_{k}": record.earlier.get(f"judge_{k}", 0.0)
                              + session.judge_totals.get(f"judge/{k}", 0.0)
                              for k in ("calls", "cost_usd", "retries", "unpriced_calls")}
    earlier, now = record.earlier.get("rollouts") or {}, session.missing.record()  # type: ignore[union-attr]
    totals["rollouts"] = {"scored": earlier.get("scored", 0) + now["scored"],
                          "missing": earlier.get("missing", 0) + now["missing"],
                          "missing_by_error": dict(Counter(earlier.get("missing_by_error", {}))
                                                   + Counter(now["missing_by_error"]))}
    return totals


def questions_written(dataset: dict) -> bool:
    """Whether this invocation wrote (and paid for) questions: its record is saved at once, as the cache keeps them
    and a rerun reads them at $0."""
    questions = dataset.get("questions")
    return isinstance(questions, dict) and bool(questions.get("written_now") or questions.get("cost_usd"))


def with_earlier_question_cost(dataset: dict, earlier: dict) -> dict:
    """dataset=documents: the questions' $ over the run's invocations (a resume reads them from the cache at $0, and
    its record said the run had spent nothing on them). dataset=inbox's record keeps the val digest the run trained
    with, which a resume on its documents is checked against, and its own as ``inbox_val_sha256``: an online invocation
    dropped the run's (a later resume on changed documents went on) or replaced it (one on the same was refused)."""
    trained = (earlier.get("dataset") or {}).get("val_sha256")
    if dataset.get("kind") == "inbox":
        own = {"inbox_val_sha256": dataset["val_sha256"]} if "val_sha256" in dataset else {}
        dataset = {**{k: v for k, v in dataset.items() if k != "val_sha256"}, **own,
                   **({"val_sha256": trained} if trained else {})}
    questions = dataset.get("questions")
    spent = ((earlier.get("dataset") or {}).get("questions") or {}).get("cost_usd") or 0.0
    if not isinstance(questions, dict) or not spent:
        return dataset
    return {**dataset, "questions": {**questions, "cost_usd": questions.get("cost_usd", 0.0) + spent}}


def carry_question_cost(splits: Splits, before: Splits) -> Splits:
    """``splits`` read again, with what the questions of ``before`` (the same invocation's earlier read) cost."""
    splits.record = with_earlier_question_cost(splits.record, {"dataset": before.record})
    return splits


def with_failed_question_cost(earlier: dict, spent: float) -> dict:
    """The run's dataset record when writing questions failed part-way: the earlier invocations' $ plus what this one
    paid (the rerun reads those written from the cache at $0, so it was never counted)."""
    dataset = earlier.get("dataset") or {}
    questions = dataset.get("questions") or {}
    return {**dataset, "questions": {**questions, "cost_usd": (questions.get("cost_usd") or 0.0) + spent}}


# What a resumed run must keep: its val split and val scoring, its reward and judge, its prompt and its model. (A key
# ending in "." covers its section.) A resume with others went through: its val scores were ranked with the earlier
# ones (step=best, best_val_score) though measured on other documents or with another reward. trainer.max_steps,
# dataset.train_size (growing train keeps val fixed) and every operational setting may change.
RESUMED_AS_TRAINED = ("seed", "dataset.kind", "dataset.name", "dataset.path", "dataset.files", "dataset.hf_path",
                      "dataset.hf_split", "dataset.seed", "dataset.val_size", "dataset.max_document_tokens",
                      "dataset.long_documents", "dataset.questions.", "reward.", "judge.kind", "judge.model",
                      "judge.min_recall",
                      "trainer.prompt", "trainer.max_words", "trainer.max_summary_tokens",
                      "trainer.val_rollouts_per_doc", "trainer.val_temperature",
                      "trainer.val_qa_max_chars", "trainer.val_qa_forbid_han",
                      "trainer.groups_per_step", "model.base_model", "model.weights", "model.lora.", "sft.kind")
# What online learning (dataset=inbox) must keep of the run it goes on from: its adapter's model, the prompt it serves.
RESUMED_ONLINE = ("model.base_model", "model.weights", "model.lora.", "trainer.prompt", "trainer.max_words")
# dataset.questions.*: other settings write other questions for the val documents, whose QA scores the earlier ones
# are ranked with (their cost, cache and confirmation are OPERATIONAL).
# ART's iterate_dataset finds where a resume goes on from the step and groups_per_step: another group count went on
# from another document, training some twice in the epoch and skipping others. sft.kind: a run trained with SFT
# resumed without counted the SFT checkpoint as a GRPO step, and one trained without it resumed with it ran SFT on top
# of its GRPO steps, then every GRPO step again.


def check_resumed_as_trained(config: Config, record: RunRecord) -> None:
    """A run folder's earlier invocations trained with the settings this one resumes: refused otherwise, before
    anything is written (the record keeps the config the checkpoints were trained with)."""
    earlier = record.earlier.get("config")
    if not isinstance(earlier, dict) or not (record.earlier.get("attempts") or record.earlier.get("val_history")):
        return
    # online learning goes on from any run, with its own val set and its judge: only its model and prompt must be the
    # run's (another LoRA rank wrote the inbox's questions, paid, then failed to load the adapter with a traceback)
    online = config.dataset.kind == "inbox"
    now = flat_config(config, record.job)
    # a record from before trainer.val_qa_* existed: the rules its val QA was measured with (not a setting removed)
    earlier = {**val_qa_settings(earlier), **earlier}

    def fixed(key: str) -> bool:
        return (any(key == k or (k.endswith(".") and key.startswith(k))
                    for k in (RESUMED_ONLINE if online else RESUMED_AS_TRAINED))
                and not key.endswith(OPERATIONAL))

    # keys both configs have: a setting added or removed by another summrl version is not a change of the run's
    changed = [k for k in sorted(set(now) & set(earlier)) if fixed(k) and str(now[k]) != str(earlier[k])]
    # another option of a group (reward=qa, now length_penalized) is named as such, not by each of its settings
    groups = [g for g in (("model",) if online else ("dataset", "model", "reward", "judge", "sft"))
              if g in earlier and g in now and now[g] != earlier[g]]
    changed = groups + [k for k in changed if k.split(".")[0] not in groups]
    # trainer.val_temperature=null draws the val summaries at trainer.temperature: another one is other val draws
    # (where both records have the setting, as above)
    key = "trainer.val_temperature"
    if (not online and key in now and key in earlier and key not in changed
            and val_sampling(now) != val_sampling(earlier)):
        changed.append("trainer.temperature")
    size = "dataset.train_size"
    if not online and size in now and size in earlier and str(now[size]) != str(earlier[size]) and not changed:
        log.warning(f"summrl: warning: {size}={now[size]}, trained with {earlier[size]}: the train documents are "
                    "shuffled again for the new size, so this epoch may train some documents twice and others not")
    if changed:
        said = ", ".join(f"{k}={earlier.get(k)} (now {now.get(k)})" for k in changed[:4])
        raise ConfigError(f"run.name={config.run.name} resumes a run trained with {said}"
                          f"{f' and {len(changed) - 4} more' if len(changed) > 4 else ''}: its checkpoints and val "
                          "scores are of those settings. Resume it with them, or give this run a new run.name")


async def train(config: Config, record: Optional[RunRecord] = None) -> Optional[float]:
    """Run (or resume) one training job, keeping its ``result.json`` in ``record``. Returns the final val score."""
    record = record or RunRecord(config.run.dir)
    check_resumed_as_trained(config, record)
    # dataset=inbox: one online run of a run at a time, refused before anything is written to its folder
    held = inbox.hold_training(config.run.dir) if config.dataset.kind == "inbox" else None
    # config: every resolved setting (as the W&B config has it), so a preset changed later can't blur what ran
    record.update(status="running", best_by=best_by(config), run_name=config.run.name, run_dir=config.run.dir,
                  seed=config.seed,
                  algorithm=asdict(config.algorithm), config=flat_config(config, record.job), **record.job.record())
    session: Optional[Session] = None

    def save() -> None:
        """The record, with the run's judge spend and rollouts so far: a killed invocation (a preempted machine)
        keeps its earlier invocations' and its own up to its last logged step."""
        if session is not None:
            record.update(**run_totals(session, record))
        record.save()

    def save_scored() -> None:
        """After a val pass: the record, backed up with the history's rows of the pass. They went up with the next
        step's backup only: a machine lost before it paid for the pass again on the next one (the step-0 and
        before-SFT passes too, which no backup followed before step 1's)."""
        save()
        if backup is not None:
            backup.after_val(config.run.dir)

    end_cut_line(history_path(config))
    tracker = open_tracker(config, record.job, history_path(config))  # first: any failure shows on the W&B run
    backup: Optional[CheckpointBackup] = None
    last_trained: Optional[int] = None  # the step this invocation trained last
    try:
        backup = CheckpointBackup.open(config)  # S3: checks the bucket before any model loads
        if not record.earlier:  # a fresh machine: the record the run's earlier invocations backed up
            record.adopt(backup.restore_result(config.run.dir))
            check_resumed_as_trained(config, record)  # as the machine that trained it checked (it loaded theirs)
        history = record.val_history
        seed_everything(config.seed)
        t = config.trainer

        def before_questions(val: list[Document], train: list[Document]) -> None:  # what the split alone refuses
            check_same_val(config, record.earlier, val_digest(val))
            check_groups_fit(config, len(train), record.earlier)

        try:  # dataset=documents: questions written (and paid for) here, if need be
            splits = await load_documents(config, before_questions=before_questions)
        except BaseException as e:
            if spent := getattr(e, "questions_cost_usd", None):
                record.update(dataset=with_failed_question_cost(record.earlier, spent))
            raise
        val, train_docs = splits.val, splits.train
        record.update(dataset=with_earlier_question_cost(splits.record, record.earlier))
        if questions_written(splits.record):
            record.save()  # the questions just paid for: a machine lost before the first val pass's save lost them
        check_documents(config, [*val, *train_docs])  # what the reward needs from the data, before the model loads
        check_groups_fit(config, len(train_docs), record.earlier)  # again: the question check may have left fewer
        warn_short_run(config, len(train_docs))
        backup.restore()  # no local checkpoint: the latest complete one from S3, so the backend resumes at its step
        resume_step = latest_local_step(config)  # the checkpoint it will resume from
        inbox.forget_after(config.run.dir, resume_step)
        try:
            splits, online = await online_documents(config, splits)  # dataset=inbox: the new documents, before loading
        except (KeyboardInterrupt, asyncio.CancelledError):
            if config.dataset.kind == "inbox":
                record.stop_waiting()
            raise
        if online is not None:
            val, train_docs = splits.val, splits.train
            record.update(dataset=with_earlier_question_cost(splits.record, record.earlier),
                          online={"new_documents": len(online.new), "consumed_before": online.start})
            if questions_written(splits.record):
                record.save()
            if len(online.new) < t.min_new_documents:
                log.info(f"summrl: inbox: {len(online.new)} new document(s), fewer than trainer.min_new_documents="
                         f"{t.min_new_documents}: nothing to train (rerun when more have been recorded)")
                record.nothing_to_train(status="completed")
                return None
        check_reference(config, resume_step)
        sft.confirm_cost(config, train_docs)  # sft=distill: the teacher's plan and price, asked before any spend
        session = await open_session(config, tracker)
        if config.backend.kind == "embedded":  # its engine has loaded: the policy's context is known
            check_context(session.backend.engine, [*val, *train_docs], SummaryPrompt.of(t), t.max_summary_tokens)
            check_packing(session.backend.engine, train_docs, SummaryPrompt.of(t), t.max_summary_tokens,
                          t.rollouts_per_group, config.backend.packed_sequence_length)
        step = await session.model.get_step()
        if said := unrecorded_checkpoint(config, step):
            log.warning(said)
        record.resume_at(step)
        # A managed job's id (SkyPilot sets it in the job's environment): its recoveries are counted per job id.
        record.begin_attempt(step, os.environ.get("SKYPILOT_MANAGED_JOB_ID"))
        keep_trained_config(config.run.dir)  # past every check: what serve, export and benchmark read
        tracker.trains()
        history = record.val_history
        scored_before = len(history)
        planned = (f"{len(online.new)} new inbox documents, {math.ceil(len(online.new) / t.groups_per_step)} step(s) "
                   f"from step {step}" if online is not None else
                   f"{'resuming at' if step else 'starting at'} step {step} of {t.max_steps}")
        log.info(f"summrl: run {config.run.name} in {config.run.dir} | {len(train_docs)} train / {len(val)} val documents"
                 f" | {planned}")

        sft_steps = 0
        if config.sft.kind != "none":
            before = step
            step, sft_record = await sft_stage(session, val, train_docs, history, step, backup, save_scored)
            record.update(sft=sft_record)
            sft_steps = sft_record["step"]
            if step != before:  # SFT trained now (a resumed run never redoes it): a stop from here on names its step
                record.trained(step)
            save()
            if session.stopping:
                raise asyncio.CancelledError  # the signal's stop, SFT's step recorded
        # dataset=inbox: each new document once, in the order it was recorded; otherwise epochs of the train split
        batches = (online.batches(step, t.groups_per_step) if online is not None
                   else training_batches(train_docs, t, config.seed, initial_step=step - sft_steps))
        trained_steps: list[tuple[int, bool]] = []  # (step, no group trainable) of this invocation
        key = val_set(config, val)
        if online is not None and not scored_at(history, step, key):  # where online learning starts, on its val set
            history.append(await evaluate(session, val, step))
            save_scored()
        for batch in batches:
            if batch.step >= t.max_steps and online is None:
                break
            if batch.step % t.eval_every == 0 and not scored_at(history, batch.step + sft_steps, key):
                history.append(await evaluate(session, val, batch.step + sft_steps))
                save_scored()  # survives a crash, and the machine
            if online is not None:
                online.before_step(batch)  # the watermark first: see summrl.inbox
            scored, trained = await train_step(session, batch.items, batch.step)
            flat = trained.metrics.get("data/step_num_groups_trainable") == 0  # ART's count, on every backend
            if flat:
                record.untrained(trained.step)  # saved with the step below
            trained_steps.append((trained.step, flat))
            step = trained.step
            record.trained(step)  # its checkpoint is written: a Ctrl-C from here on names this step (it named the last)
            last_trained = step
            await session.model.log(scored.groups, split="train", step=trained.step,
                                    metrics={**trained.metrics, **scored.metrics(), **session.judge_usage()})
            session.tracker.log_history()
            await backup.after_step(step)
            save()  # with the checkpoint's backup: a preempted machine leaves its attempt's steps in S3
            backup.save_result(config.run.dir)
            timing = " ".join(f"{k[:-2]} {v:.1f}s" for k, v in scored.timings.items())
            log.info(f"summrl: step {step} | train reward {scored.mean_reward():.3f} | {timing}"
                     f"{' | nothing trained: every group scored its summaries alike' if flat else ''}")
            if session.stopping:
                raise asyncio.CancelledError  # the signal's stop, its step recorded
        if trained_steps and all(flat for _, flat in trained_steps):
            log.warning(nothing_learned(config, [s for s, _ in trained_steps], record.job.choices.get("reward")))
        if not scored_at(history, step, key):
            history.append(await evaluate(session, val, step))
            save()  # before the final upload: a machine lost during it would pay for this val pass again
        if not await backup.after_step(step, final=True):  # the final val rows reach the backed-up history
            # there is no next backup to try again: a run recorded completed (exit 0) let a managed job or
            # down_after_run delete the machine holding the only copy of its last checkpoint
            raise StorageError(f"the last checkpoint (step {step}) could not be backed up to {backup.url} (the "
                               f"warning above says why): it is only in {config.run.dir} on this machine. Copy the "
                               "run folder off before the machine goes, or run the same command again on it once S3 "
                               "answers: it trains no step again and backs the checkpoint up")
        record.update(status="completed", steps=step, **val_summary(history))
        if not record.stepped and len(history) == scored_before:
            record.idle()  # a rerun of a finished run (a sweep's finished job, rerun with the rest)
        return history[-1]["val_reward"]
    except (KeyboardInterrupt, asyncio.CancelledError) as e:  # Ctrl-C: asyncio.run cancels this task, then raises
        if record.stopped_waiting:
            pass
        elif record.leaves_as_it_was(e):
            record.refused()  # a rerun of a completed run stopped before it trained: the run is as it was
        else:
            record.update(status="interrupted", error=f"interrupted ({stop_signal()})")
        if backup is not None and last_trained is not None:  # backup_every > 1: the step it stopped after goes up too
            await backup.after_step(last_trained, final=True)
        raise
    except BaseException as e:
        if record.leaves_as_it_was(e):
            record.refused()  # a resume stopped before it trained: the run is as it was
        else:
            record.update(status="failed", error=redact_text(f"{type(e).__name__}: {e}"),
                          traceback=redact_text(traceback.format_exc()))
        raise
    finally:
        if session is not None:
            session.judge_usage()  # the calls since the last log (a failed step's too) join the totals
            record.update(**run_totals(session, record))
        if "sft" not in record.fields and (stopped := sft.record_before_training(config)):
            record.update(sft=stopped)
        # the run's peak: an invocation that resumed or only looked (a finished sweep rerun) peaks lower
        record.update(peak_rss_gb=max(peak_rss_gb(), record.earlier.get("peak_rss_gb") or 0.0))
        if record.fields.get("status") in ("failed", "interrupted") and record.val_history:
            # what the run reached before it stopped, for summrl.report (it showed nothing)
            try:
                record.update(**val_summary(record.val_history), steps=record.attempts[-1]["end_step"]
                              if record.attempts else record.val_history[-1]["step"])
            except (TypeError, ValueError, KeyError):  # a pass with no score: the record, not the run's error
                pass
        record.save()
        if backup is not None:
            backup.save_result(config.run.dir)
        # the run's status as recorded: a resume refused before it trained leaves the earlier one, and its exit code
        tracker.finish(record.fields["status"], record.fields.get("exit_code") if record.was_refused else None)
        if session is not None:
            await session.backend.close()
        if held is not None:
            held.close()
