"""What a training forward pass keeps for the backward pass: less, by remaking what is cheap to remake.

Autograd keeps every tensor an op needs for its gradient. Some of them are cheap to compute again from tensors it
keeps anyway, so under ``keeping_less()`` autograd keeps a way to remake them instead (``Remade``), and remakes them
when the backward pass reaches them, with the same ops on the same inputs: the same bits, so the same gradients.
A decoder layer of the Llama family (Llama, Qwen2, Qwen3, SmolLM2), after ``install``:

- each RMSNorm's output, which the LoRA of the projections after it keeps, is remade from the norm's input (which
  the norm keeps itself);
- the attention's output, which o_proj's LoRA keeps, from the outputs SDPA keeps (``attention_output``);
- the gated MLP's silu(gate) and silu(gate) * up, which down_proj's LoRA keeps, from gate and up.

SmolLM2-135M on a 992-token row: 1.08 -> 0.79 MB kept a token over its 30 layers, for a few ms of pointwise work
a layer in the backward pass.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterator, Optional

import torch

# Tensors (by storage) that may be kept as a way to remake them, while the call that reads them runs: a storage is
# only identified by its address while the tensor lives, and a consumer's input lives while the consumer runs.
_live: contextvars.ContextVar[Optional[dict[int, "_Maker"]]] = contextvars.ContextVar("summrl_remade", default=None)


class _Maker:
    """Remakes one tensor, once for all the places that kept it (q, k and v's LoRA keep one norm output)."""

    def __init__(self, make: Callable[[], torch.Tensor]) -> None:
        self.make, self.made = make, None

    def __call__(self) -> torch.Tensor:
        if self.made is None:
            with torch.no_grad():
                self.made = self.make()
        return self.made


class Remade:
    def __init__(self, maker: _Maker, t: torch.Tensor) -> None:
        self.maker, self.size, self.stride, self.offset = maker, t.size(), t.stride(), t.storage_offset()

    def tensor(self) -> torch.Tensor:
        return self.maker().as_strided(self.size, self.stride, self.offset)


@contextlib.contextmanager
def keeping_less(observe: Optional[Callable[[torch.Tensor], None]] = None) -> Iterator[None]:
    """Autograd keeps a way to remake what ``remade_while`` registered; ``observe`` sees each tensor it keeps as is."""
    live: dict[int, _Maker] = {}

    def pack(t: torch.Tensor) -> Any:
        maker = live.get(t.untyped_storage().data_ptr()) if live else None
        if maker is not None:
            return Remade(maker, t)
        if observe is not None:
            observe(t)
        return t

    def unpack(saved: Any) -> torch.Tensor:
        return saved.tensor() if isinstance(saved, Remade) else saved

    token = _live.set(live)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        _live.reset(token)


@contextlib.contextmanager
def remade_while(tensor: torch.Tensor, make: Callable[[], torch.Tensor]) -> Iterator[None]:
    """While the block runs, what autograd keeps of ``tensor`` (or of a view of it) is kept as ``make``, which must
    give the same values in the same layout. Outside ``keeping_less`` or without gradients: nothing happens."""
    live = _live.get()
    if live is None or not torch.is_grad_enabled():
        yield
        return
    key = tensor.untyped_storage().data_ptr()
    live[key] = _Maker(make)
    try:
        yield
    finally:
        live.pop(key, None)


# The keys registered by ``remade`` inside the consumer call that runs now (``_after_norm``), removed when it returns.
_scope: contextvars.ContextVar[Optional[list[int]]] = contextvars.ContextVar("summrl_remade_scope", default=None)


def remade(tensor: torch.Tensor, make: Callable[[], torch.Tensor]) -> None:
    """``remade_while`` until the consumer call around this one (``_after_norm``) returns, for a tensor made inside
    it that lives until then (the attention's output, which o_proj reads last); outside such a call, nothing."""
    live, scope = _live.get(), _scope.get()
    if live is not None and scope is not None and torch.is_grad_enabled():
        key = tensor.untyped_storage().data_ptr()
        live[key] = _Maker(make)
        scope.append(key)


def _after_norm(consumer: Any, norm: Any, norm_forward: Any, *args: Any, **kwargs: Any) -> Any:
    """``consumer(hidden, ...)`` where ``hidden`` (first or ``hidden_states=``) is ``norm``'s latest output: kept as
    the norm of its input."""
    source = norm.__dict__.pop("_summrl_input", None)
    hidden = args[0] if args else kwargs.get("hidden_states")
    live = _live.get()
    if source is None or source[1] is not hidden or live is None:
        return consumer(*args, **kwargs)
    scope: list[int] = []
    token = _scope.set(scope)
    try:
        with remade_while(hidden, functools.partial(norm_forward, source[0])):
            return consumer(*args, **kwargs)
    finally:
        _scope.reset(token)
        for key in scope:
            live.pop(key, None)


def _norm(norm_forward: Any, norm: Any, x: torch.Tensor) -> torch.Tensor:
    out = norm_forward(x)
    if torch.is_grad_enabled():  # the input and the output, for the output's consumer
        norm.__dict__["_summrl_input"] = (x, out)
    return out


class _SiluMul(torch.autograd.Function):
    """``silu(gate) * up`` that keeps only gate and up for the backward pass and recomputes silu(gate) there."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad * up, gate), grad * torch.nn.functional.silu(gate)


def _gated_mlp_forward(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` keeping gate and up, where autograd's own graph keeps silu(gate) and the
    product too (down_proj's LoRA keeps the product for its gradient): 3.0 of SmolLM2's 9.7 KB per token and layer."""
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    if not torch.is_grad_enabled():
        return mlp.down_proj(torch.nn.functional.silu(gate) * up)
    hidden = _SiluMul.apply(gate, up)
    with remade_while(hidden, lambda: torch.nn.functional.silu(gate) * up):
        return mlp.down_proj(hidden)


def install(model: torch.nn.Module) -> int:
    """Route the model's decoder layers through the remaking above; returns how many layers were changed. A layer
    of another shape keeps its own forward (and autograd keeps all it keeps)."""
    changed = 0
    for layer in model.modules():
        if not all(hasattr(layer, n) for n in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")):
            continue
        for norm_name, consumer_name in (("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp")):
            norm, consumer = getattr(layer, norm_name), getattr(layer, consumer_name)
            norm_forward = norm.forward
            norm.forward = functools.partial(_norm, norm_forward, norm)
            consumer_forward = consumer.forward
            mlp = consumer_name == "mlp" and _is_gated_silu(consumer)
            if mlp:
                consumer_forward = functools.partial(_gated_mlp_forward, consumer)
            consumer.forward = functools.partial(_after_norm, consumer_forward, norm, norm_forward)
        changed += 1
    return changed


def _is_gated_silu(mlp: Any) -> bool:
    act = type(getattr(mlp, "act_fn", None))
    # transformers' SiLUActivation is F.silu under its own class name
    return all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")) and (
        act is torch.nn.SiLU or act.__name__ == "SiLUActivation")
