"""``EmbeddedBackend``: ART's Backend protocol (0.5.18, ``art/backend.py``) on the embedded engine.

Checkpoints follow ART's layout, ``<path>/<project>/models/<name>/checkpoints/<step:04d>/``, each
holding the LoRA adapter and the AdamW state, so ART's ``get_step`` and ``delete_checkpoints`` work
unchanged. Registering a model that already has checkpoints resumes from the latest one.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Optional

from art import dev
from art._backend_training import aggregate_rl_training_metrics, build_rl_train_configs
from art.backend import Backend
from art.model import Model, TrainableModel
from art.preprocessing.pack import packed_tensors_from_tokenized_results
from art.preprocessing.tokenize import tokenize_trajectory_groups
from art.trajectories import Trajectory, TrajectoryGroup
from art.types import TrainResult
from art.utils.get_model_step import get_step_from_dir
from art.utils.output_dirs import get_model_dir, get_step_checkpoint_dir

from summrl.backends.embedded.compute import compute, on_compute_thread
from summrl.backends.embedded.engine import Engine, round_up
from summrl.backends.embedded.server import Batcher, InferenceServer, build_app
from summrl.errors import ConfigError


def _return_freed_memory() -> None:
    """glibc keeps freed memory in per-thread arenas, and each job starts new threads: without this, each job of a
    sweep run in one process adds about 400 MB of resident memory that the next cannot reuse."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to return
        pass


def has_reward_variance(group: TrajectoryGroup) -> bool:
    """ART's rule (``art.metrics_taxonomy._group_is_trainable``, which counts ``data/step_num_groups_trainable``):
    any two rewards differ. A tolerance (1e-9) skipped groups LocalBackend trains (0.1 + 0.2 against 0.3), while the
    count said they were trained, so such a step was neither trained nor recorded as untrained."""
    rewards = [t.reward for t in group.trajectories]
    return len(rewards) > 1 and len(set(rewards)) > 1


class EmbeddedBackend(Backend):
    def __init__(self, config: Any, *, model: Any, path: str) -> None:
        """``config`` is an EmbeddedBackendConfig, ``model`` the ModelConfig whose weights to load."""
        self.config = config
        self.model_config = model
        self._path = path
        self._engine: Optional[Engine] = None
        self._server: Optional[InferenceServer] = None
        self._batcher: Optional[Batcher] = None
        self._api_key = secrets.token_urlsafe(16)
        self._models: dict[str, TrainableModel] = {}

    # ------------------------------------------------------------------ helpers

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = on_compute_thread(
                Engine,
                base_model=self.model_config.base_model,
                weights=self.model_config.weights,
                lora=self.model_config.lora,
                device=self.config.device,
                dtype=self.config.dtype,
                num_threads=self.config.num_threads,
                max_string_chars=self.config.json_max_string_chars,
                chat_template_kwargs=dict(self.model_config.chat_template_kwargs),
            )
        return self._engine

    def model_dir(self, model: Model) -> str:
        return get_model_dir(model=model, art_path=self._path)

    def _served_models(self) -> dict[str, bool]:
        """Names the endpoint answers: each model's latest checkpoint (LoRA) and the base model (no LoRA)."""
        names = {self.model_config.base_model: False}
        for model in self._models.values():
            step = get_step_from_dir(self.model_dir(model))
            names[f"{model.name}@{step}"] = True
            names[model.name] = True
        return names

    # ------------------------------------------------------------------ ART Backend protocol

    def _model_inference_name(self, model: Model, step: int | None = None) -> str:
        if step is None:
            step = get_step_from_dir(self.model_dir(model)) if model.trainable else 0
        return f"{model.name}@{step}"

    async def close(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
            self._server = None
        if self._batcher is not None:
            await asyncio.to_thread(self._batcher.close)
            self._batcher = None
        # The weights, optimizer and caches go with the engine: a sweep runs its jobs one after another in one
        # process, and whatever still refers to this backend (ART's model object) must not keep them alive.
        self._engine = None
        self._models.clear()
        gc.collect()
        _return_freed_memory()

    async def register(self, model: Model) -> None:
        model.base_path = self._path
        output_dir = self.model_dir(model)
        os.makedirs(output_dir, exist_ok=True)
        with open(f"{output_dir}/model.json", "w") as f:
            json.dump(model.model_dump(mode="json"), f)
        if model.trainable:
            if self._models and model.name not in self._models:
                raise ValueError("the embedded backend trains one model at a time; start another run for another model")
            self._models[model.name] = model  # type: ignore[assignment]

    async def _get_step(self, model: TrainableModel) -> int:
        return get_step_from_dir(self.model_dir(model))

    async def _delete_checkpoint_files(self, model: TrainableModel, steps_to_keep: list[int]) -> None:
        # imported here: importing art.local loads LocalBackend, whose mp_actors applies nest_asyncio to the whole
        # process and sets multiprocessing's start method to spawn; an embedded run needs neither
        from art.local.checkpoints import delete_checkpoints

        delete_checkpoints(self.model_dir(model), steps_to_keep)

    async def _prepare_backend_for_training(
        self, model: TrainableModel, config: dev.OpenAIServerConfig | None = None
    ) -> tuple[str, str]:
        engine = await compute(lambda: self.engine)
        step = get_step_from_dir(self.model_dir(model))
        if step > 0:  # resume: the adapter and optimizer of the latest checkpoint
            await compute(engine.load_checkpoint, Path(get_step_checkpoint_dir(self.model_dir(model), step)))
        if self._server is None:
            self._batcher = Batcher(engine, self.config.max_batch_size, self.config.batch_window_ms / 1000)
            app = build_app(engine, self._batcher, self._api_key, self._served_models)
            self._server = InferenceServer(app)
            await asyncio.to_thread(self._server.start)
        return self._server.base_url, self._api_key

    async def train(  # type: ignore[override]
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        *,
        learning_rate: float = 5e-6,
        loss_fn: str = "cispo",
        normalize_advantages: bool = True,
        kl_penalty_coef: float = 0.0,
        kl_penalty_reference_step: int | None = None,
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        advantage_balance: float = 0.0,
        scale_rewards: bool = True,
        importance_sampling_level: str = "token",
        max_negative_advantage_importance_sampling_weight: float | None = None,
        save_checkpoint: bool = True,
        **unsupported: Any,
    ) -> TrainResult:
        """One GRPO step as LocalBackend.train defines it: ART tokenizes, packs and computes the loss; AdamW
        on the LoRA weights; then a checkpoint. With kl_penalty_coef > 0 the reference is the base model, or
        this model's checkpoint ``kl_penalty_reference_step`` (as LocalBackend resolves it)."""
        if loss_fn not in ("cispo", "ppo"):
            raise ValueError(f"the embedded backend supports loss_fn='cispo' or 'ppo', got {loss_fn!r}")
        ignored = {k: v for k, v in unsupported.items() if v not in (None, False, 0, 0.0)}
        if ignored:
            raise ValueError(f"the embedded backend does not support {', '.join(sorted(ignored))}")
        if not normalize_advantages:  # LocalBackend's alias
            scale_rewards = False
        reference = self._reference_checkpoint(model, kl_penalty_reference_step)
        started = time.monotonic()
        groups = list(trajectory_groups)
        trainable = [g for g in groups if has_reward_variance(g)]  # zero variance: no signal
        config, dev_config = build_rl_train_configs(
            learning_rate=learning_rate,
            advantage_balance=advantage_balance,
            scale_rewards=scale_rewards,
            importance_sampling_level=importance_sampling_level,  # type: ignore[arg-type]
            ppo=loss_fn == "ppo",
            epsilon=epsilon,
            epsilon_high=epsilon_high,
            max_negative_advantage_importance_sampling_weight=max_negative_advantage_importance_sampling_weight,
            kl_penalty_coef=kl_penalty_coef,
        )
        step_metrics: list[dict[str, float]] = []
        packed = await compute(self._pack, trainable, scale_rewards, advantage_balance)
        if packed is not None:
            step_metrics = await compute(self.engine.train_packed, packed, config, dev_config, reference)
        step = get_step_from_dir(self.model_dir(model)) + 1
        if save_checkpoint:
            directory = Path(get_step_checkpoint_dir(self.model_dir(model), step))
            directory.parent.mkdir(parents=True, exist_ok=True)
            await compute(self.engine.save_checkpoint, directory)
        metrics = aggregate_rl_training_metrics(
            training_metrics=step_metrics, trajectory_groups=groups, trainer_started=started
        )
        metrics["train/skipped_zero_variance_groups"] = float(len(groups) - len(trainable))
        metrics["train/packed_sequences"] = float(0 if packed is None else packed["tokens"].shape[0])
        return TrainResult(step=step, metrics=metrics)

    def _reference_checkpoint(self, model: TrainableModel, step: int | None) -> Optional[Path]:
        """Checkpoint ``step``'s folder as the KL reference; None = the base model. Step 0 is the base model: the
        adapter starts as a no-op (LoRA's B = 0), and the embedded backend saves no step-0 checkpoint."""
        if not step:
            return None
        directory = Path(get_step_checkpoint_dir(self.model_dir(model), step))
        if not (directory / "adapter_model.safetensors").exists():
            steps = sorted(int(p.name) for p in directory.parent.glob("[0-9]*") if p.name.isdigit())
            raise ValueError(f"algorithm.kl_penalty_reference_step={step}: this run has no checkpoint {step} "
                             f"(it has {steps or 'none yet'}); the reference must be a step already saved, e.g. "
                             f"1 for the SFT checkpoint of sft=best_of_n or distill")
        return directory

    def tokenize(self, groups: list[TrajectoryGroup], scale_rewards: bool = True) -> list:
        """ART's tokenization, which also computes each trajectory's GRPO advantage."""
        return list(tokenize_trajectory_groups(self.engine.tokenizer, groups, allow_training_without_logprobs=False,
                                               scale_rewards=scale_rewards,
                                               chat_template_kwargs=self.engine.chat_template_kwargs or None))

    def _pack(self, groups: list[TrajectoryGroup], scale_rewards: bool = True,
              advantage_balance: float = 0.0) -> Optional[dict]:
        if not groups:
            return None
        tokenizer = self.engine.tokenizer
        results = self.tokenize(groups, scale_rewards)
        if not results:
            return None
        # One group packs into one sequence: its shared prompt once, then each completion.
        by_prompt: dict[int, int] = {}
        for r in results:
            by_prompt[r.prompt_id] = by_prompt.get(r.prompt_id, r.prompt_length) + len(r.token_ids) - r.prompt_length
        longest = max(by_prompt.values())
        seq_len = self.config.packed_sequence_length or round_up(longest, 128)
        if longest > seq_len:  # ART leaves such a group out (truncate_long_results=False): an update of nothing
            raise ConfigError(f"backend.packed_sequence_length={seq_len}: a group of this step packs into {longest} "
                              "tokens (its prompt once, then each completion), so it would not be trained and the "
                              f"step's update would be of nothing: set it to {round_up(longest, 128)} or more, or null "
                              "(each step's longest group, rounded up to 128)")
        return dict(
            packed_tensors_from_tokenized_results(
                results, seq_len, pad_token_id=tokenizer.pad_token_id, truncate_long_results=False,
                advantage_balance=advantage_balance,
            )
        )

    async def _train_sft(self, model: TrainableModel, trajectories: Iterable[Trajectory], config: Any,
                         dev_config: Any, verbose: bool = False) -> AsyncIterator[dict[str, float]]:
        """SFT as ART's LocalBackend does it: batches of ``config.batch_size`` trajectories, cross-entropy on the
        assistant tokens, LoRA, then one checkpoint at the next step."""
        engine = await compute(lambda: self.engine)
        samples = [engine.chat_sample(chat_messages(t)) for t in trajectories]
        batch_size = 8 if config.batch_size == "auto" else int(config.batch_size)
        batches = [samples[i : i + batch_size] for i in range(0, len(samples), batch_size)]
        rates = config.learning_rate if isinstance(config.learning_rate, list) else [config.learning_rate] * len(batches)
        metrics = await compute(engine.train_sft, batches, rates) if batches else []
        step = get_step_from_dir(self.model_dir(model)) + 1
        directory = Path(get_step_checkpoint_dir(self.model_dir(model), step))
        directory.parent.mkdir(parents=True, exist_ok=True)
        await compute(engine.save_checkpoint, directory)
        for row in metrics:
            yield row


def chat_messages(trajectory: Trajectory) -> list[dict]:
    """The trajectory's messages as plain dicts (an OpenAI Choice becomes its assistant message)."""
    out = []
    for item in trajectory.messages_and_choices:
        if isinstance(item, dict):
            out.append({"role": item["role"], "content": item.get("content") or ""})
        else:
            out.append({"role": "assistant", "content": item.message.content or ""})
    return out
