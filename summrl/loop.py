"""The training loop: rollouts → group rewards → ``backend.train`` → ``model.log``, with val every N steps.

Reads top to bottom. Each stage hands the next a plain value; nothing here knows which backend
or which reward it runs with.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import art
import numpy as np
import torch
from art.utils.iterate_dataset import iterate_dataset

from summrl.backends import build_backend, internal_config
from summrl.config import Config
from summrl.data import Document, load_splits
from summrl.judges import Judge, build_judge
from summrl.rewards import Missing, Reward, build_reward
from summrl.rollout import rollout, summary_of
from summrl.storage import CheckpointBackup


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

    @property
    def trainer(self):
        return self.config.trainer


class MissingRewardsError(RuntimeError):
    """Too many rollouts of a step have no reward: the judge is failing, and training on the rest would mislead."""


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


async def open_session(config: Config) -> Session:
    """Build the backend, register the ART model (loading or resuming it), then the judge and reward."""
    backend = build_backend(config, config.run.dir)
    model = art.TrainableModel(
        name=config.run.name,
        project=config.project,
        base_model=config.model.base_model,
        report_metrics=[],  # history.jsonl only; W&B arrives with logger=wandb
        _internal_config=internal_config(config),  # backend=local_gpu: vLLM engine args, Unsloth, LoRA shape
    )
    try:
        await model.register(backend)
        # judge=embedded: the same endpoint, base weights (the base model's name selects no LoRA)
        endpoint = (config.model.base_model, model.inference_base_url, model.inference_api_key)
        judge = build_judge(config.judge, endpoint if config.judge.kind == "embedded" else None)
        reward = build_reward(config.reward, judge, config.trainer.max_words)
    except BaseException:
        await backend.close()
        raise
    return Session(config=config, backend=backend, model=model, judge=judge, reward=reward)


async def sample_and_score(session: Session, documents: Sequence[Document], rollouts_per_doc: int) -> Scored:
    """Sample ``rollouts_per_doc`` summaries per document and score each group with the reward."""
    t = session.trainer
    started = time.perf_counter()
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                rollout(session.model, doc, max_words=t.max_words, max_tokens=t.max_summary_tokens,
                        temperature=t.temperature)
                for _ in range(rollouts_per_doc)
            )
            for doc in documents
        ),
        pbar_desc=None,
    )
    generated = time.perf_counter()
    by_id = {doc.id: doc for doc in documents}
    all_scores = await asyncio.gather(*(
        session.reward.score_group(by_id[str(g.trajectories[0].metadata["document_id"])], [summary_of(tr) for tr in g.trajectories])
        for g in groups
    ))
    kept, dropped, missing, last_error = [], 0, 0, ""
    for group, scores in zip(groups, all_scores):
        failed = [s for s in scores if isinstance(s, Missing)]
        if failed:
            # A missing reward is not a zero: the group carries no trustworthy signal.
            dropped, missing, last_error = dropped + 1, missing + len(failed), failed[-1].error
            continue
        for trajectory, score in zip(group.trajectories, scores):
            trajectory.reward = score.reward
            trajectory.metrics.update(score.metrics)
        kept.append(group)
    total = sum(len(g.trajectories) for g in groups)
    if total and missing / total > session.trainer.max_missing_reward_rate:
        raise MissingRewardsError(
            f"{missing} of {total} rollouts have no reward (limit trainer.max_missing_reward_rate="
            f"{session.trainer.max_missing_reward_rate}). Judge {judge_name(session.config)}: {last_error}"
        )
    scored = time.perf_counter()
    return Scored(kept, dropped, missing, {"generate_s": generated - started, "score_s": scored - generated})


def judge_name(config: Config) -> str:
    return getattr(config.judge, "model", config.judge.kind)


async def evaluate(session: Session, val: Sequence[Document], step: int) -> float:
    result = await sample_and_score(session, val, session.trainer.val_rollouts_per_doc)
    await session.model.log(result.groups, split="val", step=step,
                            metrics={**result.metrics(), **session.judge.usage_metrics()})
    return result.mean_reward()


async def train_step(session: Session, documents: Sequence[Document]) -> tuple[Scored, art.TrainResult]:
    scored = await sample_and_score(session, documents, session.trainer.rollouts_per_group)
    started = time.perf_counter()
    result = await session.backend.train(session.model, scored.groups, learning_rate=session.config.model.lr)
    scored.timings["train_s"] = time.perf_counter() - started
    return scored, result


def training_batches(train_docs: Sequence[Document], trainer, initial_step: int):
    """The step-by-step document batches. Same seed, same order; a resumed run continues the same order.

    ART's iterate_dataset reseeds the global ``random`` with the epoch number, so the trainer seed
    would not reach the data order: shuffle with it first.
    """
    docs = list(train_docs)
    random.Random(trainer.seed).shuffle(docs)
    return iterate_dataset(docs, trainer.groups_per_step, trainer.num_epochs, initial_step=initial_step, use_tqdm=False)


def write_result(run_dir: str, result: dict) -> None:
    path = Path(run_dir) / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


async def train(config: Config) -> Optional[float]:
    """Run (or resume) one training job. Returns the final val score."""
    seed_everything(config.trainer.seed)
    t = config.trainer
    val, train_docs = load_splits(config.dataset)
    started = time.time()
    history: list[tuple[int, float]] = []
    result: dict = {"status": "running", "run_name": config.run.name, "run_dir": config.run.dir}
    backup = CheckpointBackup.open(config)  # S3: checks the bucket before any model loads
    backup.restore()  # no local checkpoint: the latest complete one from S3, so the backend resumes at its step
    session = await open_session(config)
    try:
        step = await session.model.get_step()
        print(f"summrl: run {config.run.name} in {config.run.dir} | {len(train_docs)} train / {len(val)} val documents"
              f" | {'resuming at' if step else 'starting at'} step {step} of {t.max_steps}", flush=True)
        for batch in training_batches(train_docs, t, initial_step=step):
            if batch.step >= t.max_steps:
                break
            if batch.step % t.eval_every == 0:
                history.append((batch.step, await evaluate(session, val, batch.step)))
                print(f"summrl: step {batch.step} | val reward {history[-1][1]:.3f}", flush=True)
            scored, trained = await train_step(session, batch.items)
            await session.model.log(scored.groups, split="train", step=trained.step,
                                    metrics={**trained.metrics, **scored.metrics(), **session.judge.usage_metrics()})
            step = trained.step
            await backup.after_step(step)
            timing = " ".join(f"{k[:-2]} {v:.1f}s" for k, v in scored.timings.items())
            print(f"summrl: step {step} | train reward {scored.mean_reward():.3f} | {timing}", flush=True)
        if not history or history[-1][0] != step:
            history.append((step, await evaluate(session, val, step)))
            print(f"summrl: step {step} | val reward {history[-1][1]:.3f}", flush=True)
        await backup.after_step(step, final=True)  # the final val rows reach the backed-up history
        result.update(
            status="completed",
            steps=step,
            final_val_score=history[-1][1],
            best_val_score=max(score for _, score in history),
            val_history=[{"step": s, "val_reward": v} for s, v in history],
        )
        return history[-1][1]
    except BaseException as e:
        result.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        raise
    finally:
        result["wall_s"] = round(time.time() - started, 1)
        write_result(config.run.dir, result)
        backup.save_result(config.run.dir)
        await session.backend.close()
