"""The embedded engine's frozen linear layers on oneDNN, the CPU library PyTorch ships beside MKL.

PyTorch sends a CPU matrix product to MKL, and MKL runs its AVX2 kernels on an AMD processor even where the processor
has AVX-512. oneDNN (PyTorch's ``mkldnn`` ops) picks its kernels by instruction set. On a 2-core AMD EPYC (Zen 5),
float32: a training product (992 x 576 by 576 x 1536) 200 GFLOPS through MKL, 434 through oneDNN; a decode step's
(8 rows) 98 and 276 with the weight packed in oneDNN's layout; the vocabulary projection of 8 rows 12.2 and 2.7 ms.

- Training: a base layer's weight is frozen (LoRA trains beside it), so its backward pass is the input's gradient
  only, one more product, with the weight as it is: on MKL where MKL runs the processor's widest kernels (on a
  Zen 3 with AVX2, 1.21x faster training than oneDNN's product with the transposed weight), else on oneDNN.
- Sampling: each layer's weight packed once (``Linears.pack``, 0.2 s and a copy of the weights: 540 MB for
  SmolLM2-135M in float32), dropped before anything changes the weights (``Linears.unpack``).
- A LoRA layer adds its low-rank product into the base layer's output in place, where peft allocates three
  output-sized tensors for it (the product, its scaled copy and the sum).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from summrl import mkl_isa


def onednn_usable(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight^T + bias on oneDNN; ``weight`` dense (any strides) or packed by ``_reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _FrozenLinear(torch.autograd.Function):
    """x @ W^T + b for a W and b that are not trained: the backward pass returns x's gradient alone."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (weight,) = ctx.saved_tensors
        if _mkl_input_grad():
            flat = grad.reshape(-1, grad.shape[-1])
            return torch.mm(flat, weight).view(*grad.shape[:-1], weight.shape[1]), None, None
        return _product(grad.contiguous(), weight.t(), None), None, None


@functools.cache
def _mkl_input_grad() -> bool:
    """A frozen layer's input gradient, grad @ W, on MKL (W as it is) where MKL runs the processor's widest kernels;
    on oneDNN (W^T, a view) where it would not. A fixed 2-row packed batch (992 tokens a row) on a 2-core AMD EPYC
    Zen 3 (AVX2), three processes each, alternating, 4 calls each: median train 19.3 s on oneDNN, 15.9 s on MKL
    (1.21x; 27-30 s of CPU against 31-37), the same peak (2.49-2.58 GB). The forward products stay on oneDNN: on
    MKL they raised that peak by 0.3 GB."""
    return mkl_isa.widest_kernels()


def _linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed = module.__dict__.get("_packed")
    if packed is not None and not torch.is_grad_enabled():
        return _product(x, packed, module.bias)
    if module.weight.requires_grad or (module.bias is not None and module.bias.requires_grad):
        return torch.nn.functional.linear(x, module.weight, module.bias)
    if torch.is_grad_enabled() and x.requires_grad:
        return _FrozenLinear.apply(x, module.weight, module.bias)
    return _product(x, module.weight, module.bias)


def _lora_forward(layer: Any, peft_forward: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """peft's LoRA ``Linear.forward`` for one plain adapter (no dropout, no variant), its low-rank product added in
    place: base(x) + scaling * (x A^T) B^T, the sum peft computes. Anything else goes to peft's own forward."""
    adapters = layer.active_adapters
    if args or kwargs or layer.disable_adapters or layer.merged or len(adapters) != 1:
        return peft_forward(x, *args, **kwargs)
    name = adapters[0]
    if (name not in layer.lora_A or name in getattr(layer, "lora_variant", {})
            or not isinstance(layer.lora_dropout[name], torch.nn.Identity)):
        return peft_forward(x, *args, **kwargs)
    flat = x.reshape(-1, x.shape[-1])  # 2-D, so that the base layer's output is no view to add into
    out = layer.base_layer(flat)
    out.addmm_(layer.lora_A[name](flat), layer.lora_B[name].weight.t(), alpha=layer.scaling[name])
    return out.view(*x.shape[:-1], out.shape[-1])


class Linears:
    """The model's frozen linear layers (LoRA's base layers and the output projection), routed through oneDNN."""

    def __init__(self, model: torch.nn.Module) -> None:
        from peft.tuners.lora import Linear as LoraLinear

        self.layers: list[torch.nn.Linear] = []
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.forward = functools.partial(_lora_forward, module, module.forward)
        head = model.get_output_embeddings()
        for module in model.modules():
            if type(module) is torch.nn.Linear and (not module.weight.requires_grad or module is head):
                module.forward = functools.partial(_linear_forward, module)
                self.layers.append(module)
        self.packed = False

    def pack(self) -> None:
        """Each layer's current weight in oneDNN's layout, for sampling; ``unpack`` before the weights change."""
        if not self.packed:
            for module in self.layers:
                module.__dict__["_packed"] = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
            self.packed = True

    def unpack(self) -> None:
        if self.packed:
            for module in self.layers:
                module.__dict__.pop("_packed", None)
            self.packed = False
