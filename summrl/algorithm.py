"""The GRPO update's settings as ``backend.train`` arguments, and the learning rate of each step.

Only values that differ from ART 0.5.18's defaults are passed, so ``algorithm=grpo`` calls
``backend.train`` exactly as before. Light on purpose (no torch, no ART): config validation calls
:func:`check_backend_support` before anything loads.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from summrl.config import AlgorithmConfig, ConfigError

# The fields that are summrl's (not backend.train arguments).
SCHEDULE_FIELDS = ("name", "lr_schedule", "warmup_steps", "min_lr_ratio")
# backend.train arguments a backend does not accept, and whose train() that is. skypilot runs local_gpu remotely.
UNSUPPORTED: dict[str, set[str]] = {
    "local_gpu": set(),
    "skypilot": set(),
    # ServerlessBackend.train has no KL penalty and no normalize_advantages alias (use scale_rewards).
    "serverless": {"kl_penalty_coef", "kl_penalty_reference_step", "normalize_advantages"},
    "embedded": set(),
}
TRAIN_OF = {"local_gpu": "ART 0.5.18's LocalBackend.train", "skypilot": "ART 0.5.18's LocalBackend.train",
            "serverless": "ART 0.5.18's ServerlessBackend.train", "embedded": "summrl's embedded backend"}
_DEFAULTS = AlgorithmConfig()


def changed_knobs(algorithm: AlgorithmConfig) -> dict[str, Any]:
    """The backend.train arguments whose value differs from ART's default."""
    return {
        f.name: getattr(algorithm, f.name)
        for f in fields(AlgorithmConfig)
        if f.name not in SCHEDULE_FIELDS and getattr(algorithm, f.name) != getattr(_DEFAULTS, f.name)
    }


def check_backend_support(algorithm: AlgorithmConfig, backend: str) -> None:
    for knob in sorted(changed_knobs(algorithm)):
        if knob in UNSUPPORTED.get(backend, set()):
            raise ConfigError(f"algorithm.{knob}: backend={backend} does not support it ({TRAIN_OF[backend]} "
                              f"has no such setting); leave it at its default or use another backend")


def train_kwargs(algorithm: AlgorithmConfig, backend: str) -> dict[str, Any]:
    """Keyword arguments for ``backend.train``; empty for ART's defaults."""
    kwargs = changed_knobs(algorithm)
    if backend == "serverless" and "loss_fn" in kwargs:  # ServerlessBackend.train spells the loss as ppo=bool
        kwargs["ppo"] = kwargs.pop("loss_fn") == "ppo"
    return kwargs


def learning_rate(algorithm: AlgorithmConfig, base_lr: float, step: int, max_steps: int) -> float:
    """The learning rate of training step ``step`` (0-based) of ``max_steps``.

    During warmup (step < warmup_steps) it is ``base_lr * (step + 1) / (warmup_steps + 1)``, reaching base_lr at
    step ``warmup_steps``; then constant, or linear/cosine decay reaching ``min_lr_ratio * base_lr`` at the last
    step (max_steps - 1). Where the two meet (warmup_steps = max_steps - 1, or max_steps = 1) the last step
    takes base_lr: validation keeps warmup_steps < max_steps, so base_lr is always reached.
    """
    warmup = algorithm.warmup_steps
    if step < warmup:
        return base_lr * (step + 1) / (warmup + 1)
    if algorithm.lr_schedule == "constant":
        return base_lr
    span = max(1, max_steps - 1 - warmup)
    progress = min(1.0, (step - warmup) / span)
    floor = algorithm.min_lr_ratio
    if algorithm.lr_schedule == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return base_lr * (floor + (1.0 - floor) * factor)
