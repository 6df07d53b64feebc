"""Backends: where the policy samples and trains. Each is an ART ``Backend``.

``embedded`` is ours (in-process, any device); ``local_gpu`` is ART's LocalBackend (vLLM + Unsloth,
the ``[gpu]`` extra); ``serverless`` is ART's ServerlessBackend (W&B Training). ``skypilot`` builds no
backend here: ``summrl.cloud`` runs the job on a cloud GPU with ``backend=local_gpu``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from summrl.config import VLLM_LORA_RANKS


class BackendUnavailable(RuntimeError):  # summrl.preflight lists it as a config error before anything loads
    """The selected backend can't run on this machine; the message says what is missing and the fix."""


def build_backend(config: Any, run_dir: str) -> Any:
    """The ART backend for ``config.backend``. ART state (history, checkpoints) goes under ``run_dir/art``."""
    art_path = art_dir(run_dir)
    kind = config.backend.kind
    if kind == "embedded":
        from summrl.backends.embedded import EmbeddedBackend  # heavy (torch, transformers, peft): on use only

        return EmbeddedBackend(config.backend, model=config.model, path=art_path)
    if kind == "local_gpu":
        check_local_gpu(config)
        from art.local import LocalBackend

        return LocalBackend(path=art_path)
    if kind == "serverless":  # WANDB_API_KEY: checked by summrl.preflight
        from art.serverless.backend import ServerlessBackend

        return ServerlessBackend(base_url=config.backend.base_url)
    if kind == "skypilot":
        raise BackendUnavailable("backend=skypilot runs the job remotely (summrl.cloud); it has no local ART backend")
    raise ValueError(f"backend.kind={kind} is not available")


def art_dir(run_dir: str) -> str:
    """Where ART keeps a run's state (history, trajectories, checkpoints): ``<run_dir>/art``."""
    return str(Path(run_dir) / "art")


def takes_burst_tags(config: Any) -> bool:
    """Whether the backend's server reads ``summrl_burst`` (rollout.Burst): the embedded one, whose batcher then makes
    generate calls that do not depend on when each request arrived. Other servers are not sent it."""
    return config.backend.kind == "embedded"


def vllm_max_lora_rank(r: int) -> int:
    """vLLM's engine arg max_lora_rank for a LoRA of rank ``r``: the smallest value it accepts that is >= r (the
    config refuses an r above them all)."""
    return next(rank for rank in VLLM_LORA_RANKS if rank >= r)


def check_local_gpu(config: Any) -> None:
    """Fail before any model loads when ART's LocalBackend can't run ``config`` here."""
    # Unsloth (training) comes with the [gpu] extra; vLLM is not imported here: ART 0.5.18 installs its own
    # vLLM runtime venv with `uv` on first use (art.vllm_runtime), unless ART_VLLM_RUNTIME_BIN names one.
    missing = [] if importlib.util.find_spec("unsloth") else ["unsloth: pip install -e '.[gpu]'"]
    if not shutil.which("uv") and not os.environ.get("ART_VLLM_RUNTIME_BIN"):
        missing.append("uv (ART installs its vLLM runtime with it): pip install uv")
    if missing:
        raise BackendUnavailable(
            f"backend=local_gpu needs ART's LocalBackend on an NVIDIA GPU; missing {'; '.join(missing)}. "
            "Or use backend=skypilot (a cloud GPU) or backend=embedded"
        )
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            "backend=local_gpu needs a CUDA GPU and torch sees none: use backend=skypilot (a cloud GPU) "
            "or backend=embedded"
        )
    # ART's dedicated mode (model.gpus=2) trains on GPU 0 and serves on GPU 1: with one, vLLM died after Unsloth loaded
    count = torch.cuda.device_count()
    if count < config.model.gpus:
        raise BackendUnavailable(
            f"model.gpus={config.model.gpus}: model={config.model.name} trains on {config.model.gpus} GPUs (ART's "
            f"dedicated mode) and torch sees {count}: use backend=skypilot "
            f"backend.accelerators=H100:{config.model.gpus}, or a model that trains on one GPU (model.gpus=1)"
        )


def device_problems(device: str) -> list[str]:
    """backend=embedded's ``backend.device`` must be on this machine (torch's own error came after the imports, as a
    traceback)."""
    if device in ("auto", "cpu"):
        return []
    import torch

    kind, _, index = device.partition(":")
    fix = "use backend.device=auto (the GPU when there is one) or cpu"
    if kind == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        return [f"backend.device=mps: torch sees no Apple GPU (MPS) here: {fix}"]
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            build = " (a CPU-only build of torch)" if torch.version.cuda is None else ""
            return [f"backend.device={device}: torch sees no CUDA GPU here{build}: {fix}"]
        if index and int(index) >= count:
            return [f"backend.device={device}: torch sees {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}: {fix}"]
    return []


def internal_config(config: Any) -> Optional[dict]:
    """ART's model-level settings (``TrainableModel._internal_config``) for backends that read them.

    LocalBackend takes vLLM's engine args, Unsloth's init args and the LoRA shape from here
    (art.dev.get_model_config merges them over its defaults).
    """
    if config.backend.kind != "local_gpu":
        return None
    b, model = config.backend, config.model
    lora = model.lora
    # The model preset's settings first, the backend's on top (config.py refuses a key both would set).
    # vLLM refuses an adapter above its max_lora_rank (16 by default) when it loads it; ART does not pass the rank on
    rank = {"max_lora_rank": vllm_max_lora_rank(lora.r)} if lora.r > 16 else {}
    engine = {**rank, **dict(model.engine_args), "gpu_memory_utilization": b.gpu_memory_utilization,
              "enforce_eager": b.enforce_eager, **({"max_model_len": b.max_model_len} if b.max_model_len else {}),
              **dict(b.engine_args)}
    internal = {
        "engine_args": engine,
        "init_args": {**dict(model.init_args), "load_in_4bit": b.load_in_4bit, "max_seq_length": b.max_seq_length},
        "peft_args": {"r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                      "target_modules": list(lora.target_modules)},
    }
    if model.chat_template_kwargs:  # ART renders rollouts (vLLM's extra_body) and training prompts with them
        internal["chat_template_kwargs"] = dict(model.chat_template_kwargs)
    if model.gpus == 2:  # ART's dedicated mode: Unsloth trains on GPU 0, vLLM serves on GPU 1
        internal.update(trainer_gpu_ids=[0], inference_gpu_ids=[1])
    return internal
