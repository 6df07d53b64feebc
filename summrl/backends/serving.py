"""Serving a trained run's checkpoints (and the base model) on an OpenAI-compatible endpoint: the benchmark's and
``summrl.serve``'s. ``config`` is any config with ``model`` and ``backend`` sections (training's, the benchmark's).

``backend=embedded``: the embedded engine (transformers + peft, CPU) behind the embedded server,
one checkpoint's adapter at a time; the base model's name selects no adapter (also the endpoint of
judge=embedded and judge=local). ``backend=local_gpu``: ART's LocalBackend (vLLM) on this machine's GPU, which loads
each step's adapter as ``name@step``, the base model (step 0) as an adapter that adds nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, Protocol

from summrl.backends import internal_config
from summrl.backends.embedded.compute import compute
from summrl.checkpoints import TrainedRun, checkpoint_steps


class CheckpointServer(Protocol):
    base_url: str
    api_key: str
    context_length: Optional[int]  # prompt and completion together, at most (None: not known here)
    extra_body: Optional[dict]  # what every chat request must carry (None: nothing)

    async def serve(self, step: int) -> str:
        """Load ``step`` (0 = the base model) and return the name to request it by."""
        ...

    async def close(self) -> None: ...


class EmbeddedServer:
    """The embedded engine on 127.0.0.1: the base model and, after ``serve(step)``, that step's adapter."""

    extra_body = None  # the engine renders every chat with the model's chat_template_kwargs itself

    def __init__(self, config: Any, run: Optional[TrainedRun], early: bool = False) -> None:
        self.config, self.run, self.early = config, run, early  # early: see Batcher
        self.api_key = secrets.token_urlsafe(16)
        self.step = 0
        self.base_url = ""
        self._engine = self._batcher = self._server = None

    def _served(self) -> dict[str, bool]:
        names = {self.config.model.base_model: False}  # base weights: no LoRA
        if self.step and self.run is not None:
            names[f"{self.run.name}@{self.step}"] = True
        return names

    async def start(self) -> "EmbeddedServer":
        # heavy (torch, transformers): only a benchmark that serves checkpoints on this machine loads them
        from summrl.backends.embedded.engine import Engine
        from summrl.backends.embedded.server import Batcher, InferenceServer, build_app

        b, m = self.config.backend, self.config.model
        self._engine = await compute(
            Engine, base_model=m.base_model, weights=m.weights, lora=m.lora, device=b.device, dtype=b.dtype,
            num_threads=b.num_threads, max_string_chars=b.json_max_string_chars)
        self._batcher = Batcher(self._engine, b.max_batch_size, b.batch_window_ms / 1000, early=self.early)
        self._server = InferenceServer(build_app(self._engine, self._batcher, self.api_key, self._served))
        await asyncio.to_thread(self._server.start)
        self.base_url = self._server.base_url
        return self

    @property
    def context_length(self) -> Optional[int]:
        return None if self._engine is None else self._engine.context_length

    async def serve(self, step: int) -> str:
        if step == 0:
            return self.config.model.base_model
        assert self.run is not None
        if step != self.step:  # the caller awaits every request of the previous step first
            await compute(self._engine.load_checkpoint, self.run.checkpoint(step), optimizer=False)
            self.step = step
        return f"{self.run.name}@{step}"

    async def close(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
        if self._batcher is not None:
            await asyncio.to_thread(self._batcher.close)


class LocalGPUServer:
    """ART's LocalBackend (vLLM + Unsloth) serving the run's adapters on this machine's GPU."""

    def __init__(self, config: Any, run: TrainedRun) -> None:
        self.config, self.run = config, run
        self.base_url = self.api_key = ""
        self.context_length = config.backend.max_model_len  # None: the model's own, which vLLM enforces itself
        self._base: Optional[Path] = None  # step 0's adapter (serve)
        # vLLM renders a chat with the kwargs a request carries: ART adds them in model.openai_client() only, so
        # requests made here carry them too (qwen3_8b trained with thinking off; without them it thinks)
        kwargs = dict(config.model.chat_template_kwargs)
        self.extra_body = {"chat_template_kwargs": kwargs} if kwargs else None

    async def start(self) -> "LocalGPUServer":
        from art.local import LocalBackend

        from summrl.backends.art_model import TrainableModel  # imports ART: on use only

        # The ART layout is art/<project>/models/<name>: the project is the folder above models/.
        project = self.run.checkpoints_dir.parent.parent.parent.name
        self.backend = LocalBackend(path=str(self.run.run_dir / "art"))
        self.model = TrainableModel(name=self.run.name, project=project, base_model=self.config.model.base_model,
                                    _internal_config=internal_config(self.config))
        await self.model.register(self.backend)  # starts vLLM (a second _prepare_backend_for_training started another)
        self.base_url, self.api_key = self.model.inference_base_url, self.model.inference_api_key
        self._service = await self.backend._get_service(self.model)
        return self

    async def serve(self, step: int) -> str:
        # ART's vLLM answers to <run>@<step> only (--served-model-name), not to the base model's Hugging Face name:
        # step 0 is served as an adapter that adds nothing
        path = self.run.checkpoint(step) if step else await asyncio.to_thread(self._zero_adapter)
        await self._service.register_lora_for_step(step, str(path))
        return f"{self.run.name}@{step}"

    def _zero_adapter(self) -> Path:
        """The run's adapter with every lora_B zero (its delta B·A is then 0: the base model), in a folder of its own:
        made from any checkpoint, since a run restored from S3 lacks ART's step 0."""
        import torch
        from safetensors.torch import load_file, save_file

        if self._base is not None:
            return self._base
        # any checkpoint on disk, not only those benchmarked: benchmark.steps=[0] of a run with checkpoint 4 alone
        source = next((self.run.checkpoint(s) for s in reversed(checkpoint_steps(self.run.checkpoints_dir))), None)
        if source is None:
            raise FileNotFoundError(f"{self.run.checkpoints_dir}: no checkpoint's adapter to serve step 0 with")
        self._base = Path(tempfile.mkdtemp(prefix="summrl-step0-"))
        tensors = load_file(str(source / "adapter_model.safetensors"))
        save_file({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in tensors.items()},
                  str(self._base / "adapter_model.safetensors"))
        shutil.copyfile(source / "adapter_config.json", self._base / "adapter_config.json")
        return self._base

    async def close(self) -> None:
        await self.backend.close()
        if self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)


async def start_server(config: Any, run: Optional[TrainedRun], early: bool = False) -> CheckpointServer:
    """``early``: each request answered as its own rows end (``summrl.serve``), not with the rest of its batch. The
    benchmark's requests keep their batches' timing out of what runs next; vLLM answers each as it ends anyway."""
    if config.backend.kind == "local_gpu":
        assert run is not None
        return await LocalGPUServer(config, run).start()
    return await EmbeddedServer(config, run, early).start()
