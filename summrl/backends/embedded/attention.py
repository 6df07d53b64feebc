"""The embedded engine's attention: a registered transformers attention function and the layouts it reads.

- Decoding (one new token per row): ``SharedPrefix``, the prompts' keys and values stored once for all the rows
  sampled from them, the prompts and the rows' own tokens each attended by PyTorch's fused kernel on a CPU (two
  matrix products elsewhere, and without a ``SharedPrefix``).
- Training on a packed row (``PackedRuns``): ART packs a group as its prompt, then each completion, and masks
  each completion to its prompt and itself. Each run attends to just those keys, where a masked attention over the
  whole row computes every pair of positions (a prompt of 480 tokens and 4 completions of 128: 2.3 times the work;
  forward and backward of one layer 41 -> 16 ms on 2 cores).
- Anything else: SDPA, each key/value head shared by its query heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from summrl.backends.embedded.activations import remade, remade_while

ATTENTION = "sdpa_gqa"


def _sdpa_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
              shared_prefix: Optional["SharedPrefix"] = None, packed_runs: Optional["PackedRuns"] = None, **kwargs):
    """SDPA that shares each key/value head across its query heads (``enable_gqa``), with or without a mask.

    transformers' own SDPA path copies the KV cache to every query head whenever a mask is given
    (``repeat_kv``); with a batch of padded prompts that copy dominated decoding time on CPU.
    """
    if query.shape[2] == 1 and not torch.is_grad_enabled():
        if shared_prefix is not None:
            return _shared_prefix_attention(query, key, value, shared_prefix, module.layer_idx, scaling), None
        return _decode_attention(query, key, value, attention_mask, scaling), None
    if packed_runs is not None:
        return _packed_attention(module, query, key, value, packed_runs, scaling), None
    causal = attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout if module.training else 0.0,
        scale=scaling, is_causal=causal, enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _decode_attention(query, key, value, attention_mask, scaling) -> torch.Tensor:
    """One new token's attention as two batched matmuls, each key/value head shared by its group of query heads.

    SDPA's CPU kernel is built for long queries: for a single query position it took 14 of SmolLM2's 87 ms per decode
    step of 8 rows; these matmuls compute the same softmax(q k^T / sqrt(d)) v in a fraction of that."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query.view(batch, kv_heads, heads // kv_heads, dim)  # query head h reads key/value head h // group
    scores = torch.matmul(q, key.transpose(-1, -2)) * (dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:  # [batch, 1, 1, keys]: True (or 0.0) where a key may be attended
        scores = (scores.masked_fill(~attention_mask, -math.inf) if attention_mask.dtype == torch.bool
                  else scores + attention_mask)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [batch, kv_heads, group, dim]
    return out.view(batch, 1, heads, dim)


@dataclass
class SharedPrefix:
    """The prompts' keys and values during decoding, stored once per distinct prompt however many rows sample it.

    A group's rollouts (or best-of-N's samples) share one prompt of about 480 tokens and add at most ``max_tokens``
    of their own. Copied to every row, the prompt's cache was read once per row at every decode step: at 64 rows that
    read was most of the step. Here each prompt's rows attend to it as one block of queries, and to their own tokens
    (the rows' cache) separately; the two softmaxes are merged by their log-sum-exps.
    """

    keys: list[torch.Tensor]  # per layer: [prompts, kv_heads, width - 1, dim], each prompt but its last token,
    values: list[torch.Tensor]  # left-padded to the longest
    mask: Optional[torch.Tensor]  # [prompts, 1, 1, width - 1], True at a prompt's tokens; None: no prompt is padded
    slot: torch.Tensor  # [rows]: the row's place among the prompts' blocks, prompt * per_prompt + its rank there
    per_prompt: int  # the most rows that sample one prompt
    bias: Optional[torch.Tensor] = field(init=False)  # ``mask`` as the kernel takes it: 0 or -inf, added to scores
    empty: Optional[torch.Tensor] = field(init=False)  # [prompts, 1, 1, 1]: True where a prompt has no key at all

    def __post_init__(self) -> None:
        self.bias = self.empty = None
        if self.mask is not None:
            dtype = self.keys[0].dtype if self.keys else torch.float32
            self.bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill_(
                ~self.mask, -math.inf)
            self.empty = ~self.mask.any(-1, keepdim=True)

    @staticmethod
    def layout(row_of: list[int], prompts: int) -> tuple[torch.Tensor, int]:
        ranks, counts = [], [0] * prompts
        for prompt in row_of:
            ranks.append(counts[prompt])
            counts[prompt] += 1
        per_prompt = max(counts)
        return torch.tensor([p * per_prompt + r for p, r in zip(row_of, ranks)]), per_prompt


def _attend(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) @ values, and the scores' log-sum-exp, by which it merges with attention over other keys.

    A query whose every key is masked gets zeros and a log-sum-exp of -inf (a weight of 0 in the merge), not NaN."""
    top = scores.amax(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).min)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    return torch.matmul(weights, values) / total.clamp(min=torch.finfo(scores.dtype).tiny), top + total.log()


def _attend_keys(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                 bias: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(queries keys^T * scale + bias) values, and its log-sum-exp [..., queries, 1], over at least one key.

    On a CPU, PyTorch's fused (flash) attention kernel, which returns the log-sum-exp too: the scores never leave
    its cache-sized blocks. At 64 rows over 16 prompts of about 480 tokens (2 cores, Zen 5, profiled) the prompts'
    part of a decode step took 38 ms unfused (two products, then the scale, mask, maximum, exponentials and sums as
    separate passes) and 24 ms in the kernel. Part of it: real scores lie far enough below their maximum that
    torch.exp meets subnormal results, each many times slower (one layer's scores: 2.4 against 0.08 ms).
    A query whose every key is masked gets zeros from the kernel, with a log-sum-exp of 0: the caller masks it."""
    if queries.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            queries, keys, values, 0.0, False, attn_mask=bias, scale=scale)
        return out, lse.unsqueeze(-1)
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * scale
    return _attend(scores if bias is None else scores + bias, values)


def _shared_prefix_attention(query, key, value, prefix: SharedPrefix, layer: int, scaling) -> torch.Tensor:
    """One new token's attention over its prompt (``prefix``, shared) and its row's own tokens (``key``/``value``)."""
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    q = query.view(rows, kv_heads, group, dim)  # query head h reads key/value head h // group
    out, lse = _attend_keys(q, key, value, scale)  # [rows, kv_heads, group, dim | 1]
    prompt_keys, prompt_values = prefix.keys[layer], prefix.values[layer]
    prompts, _, length, _ = prompt_keys.shape
    if length == 0:
        return out.reshape(rows, 1, heads, dim)
    per = prefix.per_prompt
    blocks = q.new_zeros(prompts * per, kv_heads, group, dim).index_copy_(0, prefix.slot, q)
    blocks = blocks.view(prompts, per, kv_heads, group, dim).transpose(1, 2).reshape(prompts, kv_heads, per * group, dim)
    shared_out, shared_lse = _attend_keys(blocks, prompt_keys, prompt_values, scale, prefix.bias)
    if prefix.empty is not None:  # a prompt with no key before its last token: no weight in the merge
        shared_lse = shared_lse.masked_fill(prefix.empty, -math.inf)

    def to_rows(t: torch.Tensor) -> torch.Tensor:
        t = t.view(prompts, kv_heads, per, group, t.shape[-1]).transpose(1, 2)
        return t.reshape(prompts * per, kv_heads, group, t.shape[-1]).index_select(0, prefix.slot)

    shared_out, shared_lse = to_rows(shared_out), to_rows(shared_lse)
    both = torch.logaddexp(lse, shared_lse)
    out = torch.exp(lse - both) * out + torch.exp(shared_lse - both) * shared_out
    return out.to(query.dtype).reshape(rows, 1, heads, dim)  # the kernel's log-sum-exps are float32 in bfloat16


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _sdpa_gqa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


@dataclass
class PackedRuns:
    """A packed row [1, length] as runs of one group each, for ART's packing: a prompt (a run that is its own parent),
    then the completions sampled from it (runs whose parent is that prompt). ``of`` gives None where the row is laid
    out otherwise: the row's mask then runs as it is.

    A prompt attends to itself, causally. A completion attends to its prompt and to itself, causally: its keys are
    the prompt's and its own, joined (a copy, which the backward pass remakes rather than keeps)."""

    runs: list[tuple[int, int, Optional[int]]]  # (start, end, the index of the parent run, or None for a prompt)
    masks: dict[tuple[int, int, torch.dtype], torch.Tensor] = field(default_factory=dict)

    @staticmethod
    def of(group_ids: torch.Tensor, parent_ids: torch.Tensor) -> Optional["PackedRuns"]:
        if group_ids.shape[0] != 1:
            return None
        groups, parents = group_ids[0].tolist(), parent_ids[0].tolist()
        spans: list[list[int]] = []
        for i, group in enumerate(groups):
            if i and group == groups[i - 1]:
                spans[-1][1] = i + 1
            else:
                spans.append([i, i + 1])
        prompts: dict[int, int] = {}  # group id -> its run's index
        runs: list[tuple[int, int, Optional[int]]] = []
        for start, end in spans:
            group, parent = groups[start], parents[start]
            if any(p != parent for p in parents[start:end]) or group in prompts:
                return None  # one run with two parents, or a prompt's group in two places
            if parent == group:
                prompts[group] = len(runs)
                runs.append((start, end, None))
            elif parent in prompts:
                runs.append((start, end, prompts[parent]))
            else:
                return None  # a completion whose prompt is not before it in the row
        return PackedRuns(runs)

    def mask(self, parent: int, own: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[own, parent + own], additive (0 or -inf): every parent key, and the run's own keys up to each query. Made
        once for every layer (SDPA would convert a boolean mask, and keep the copy for the backward pass, in each)."""
        key = (parent, own, dtype)
        if key not in self.masks:
            allowed = torch.ones(own, parent + own, dtype=torch.bool, device=device)
            allowed[:, parent:] = torch.ones(own, own, dtype=torch.bool, device=device).tril()
            self.masks[key] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, -math.inf)
        return self.masks[key]


def _packed_attention(module, query, key, value, runs: PackedRuns, scaling) -> torch.Tensor:
    """Each run's queries over its parent's keys and its own, the sum the row's mask defines."""
    dropout = module.attention_dropout if module.training else 0.0
    sizes = [end - start for start, end, _ in runs.runs]
    queries, keys, values = query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2)
    outs = []
    for i, (_, _, parent) in enumerate(runs.runs):
        if parent is None:
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                queries[i], keys[i], values[i], dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=True))
            continue
        pair = (parent, i)
        k = torch.cat([keys[j] for j in pair], dim=2)
        v = torch.cat([values[j] for j in pair], dim=2)
        mask = runs.mask(sizes[parent], sizes[i], query.dtype, query.device)
        with remade_while(k, lambda pair=pair: torch.cat([keys[j] for j in pair], dim=2)), \
                remade_while(v, lambda pair=pair: torch.cat([values[j] for j in pair], dim=2)):
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                queries[i], k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=True))
    # [1, length, heads, dim], as the caller reads it; o_proj's LoRA keeps it, SDPA keeps its runs: remade from them
    out = torch.cat([o.transpose(1, 2) for o in outs], dim=1)
    remade(out, lambda: torch.cat([o.transpose(1, 2) for o in outs], dim=1))
    return out
