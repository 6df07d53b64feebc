"""The GRPO update's settings as ``backend.train`` arguments, and the learning rate of each step.

Only values that differ from ART 0.5.18's defaults are passed (:func:`summrl.config.changed_knobs`), so
``algorithm=grpo`` calls ``backend.train`` exactly as ART does by default. Which backend accepts which knob is a
config rule, checked by summrl.config before anything loads.
"""

from __future__ import annotations

import math
from typing import Any

from summrl.config import AlgorithmConfig, changed_knobs

def train_kwargs(algorithm: AlgorithmConfig, backend: str) -> dict[str, Any]:
    """Keyword arguments for ``backend.train``; empty for ART's defaults."""
    kwargs = changed_knobs(algorithm)
    # Step 0 is the base model, ART's None: LocalBackend would read 0 as the folder checkpoints/0000, which storage
    # never backs up, so a run resumed on a fresh machine failed its first step without adapter_config.json
    if kwargs.get("kl_penalty_reference_step") == 0:
        del kwargs["kl_penalty_reference_step"]
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
