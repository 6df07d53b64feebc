"""The embedded engine's faster paths compute what the plain ones do: oneDNN products, packed-row attention, the
head's log-probabilities, and MKL's AVX-512 kernels on AMD. Tiny random models: seconds in all."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def tiny_lora_llama(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from summrl.backends.embedded.attention import ATTENTION, register_attention

    register_attention()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, attn_implementation=ATTENTION)
    target = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=target, init_lora_weights=False))


def packed_row(prompts: list[int], completions: list[list[int]]) -> dict[str, torch.Tensor]:
    """One packed row in ART's layout: each prompt (its own parent), then its completions (parent: the prompt)."""
    groups, parents, positions = [], [], []
    next_id = 100
    for prompt, lengths in zip(prompts, completions):
        pid = next_id
        groups += [pid] * prompt
        parents += [pid] * prompt
        positions += list(range(prompt))
        for length in lengths:
            next_id += 1
            groups += [next_id] * length
            parents += [pid] * length
            positions += list(range(prompt, prompt + length))
        next_id += 1
    torch.manual_seed(1)
    return {"tokens": torch.randint(0, 97, (1, len(groups))), "group_ids": torch.tensor([groups]),
            "parent_ids": torch.tensor([parents]), "input_pos": torch.tensor([positions])}


def row_logprobs(model, row: dict[str, torch.Tensor], runs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each next token's log-probability over the row, with the row's mask (runs None) or a block at a time."""
    g, p = row["group_ids"], row["parent_ids"]
    length = g.shape[1]
    mask = None
    if runs is None:
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        mask = (causal & ((g.unsqueeze(2) == g.unsqueeze(1)) | (p.unsqueeze(2) == g.unsqueeze(1)))).unsqueeze(1)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=row["tokens"], attention_mask=mask, position_ids=row["input_pos"], packed_runs=runs).logits
    out = torch.log_softmax(logits[0, :-1], -1).gather(1, row["tokens"][0, 1:, None]).squeeze(1)
    (out * torch.linspace(-1, 1, out.shape[0])).sum().backward()
    return out.detach(), [q.grad.clone() for q in model.parameters() if q.requires_grad]


def test_a_packed_row_attended_a_run_at_a_time_gives_the_masks_logprobs_and_gradients():
    """Two groups in one row (a prompt, then its completions, twice): each run's queries over its own keys give what
    the row's mask gives, forward and backward, under keeping_less (the joined keys remade in the backward pass)."""
    from summrl.backends.embedded import activations
    from summrl.backends.embedded.attention import PackedRuns

    model = tiny_lora_llama()
    row = packed_row([9, 7], [[5, 6, 4], [3, 8]])
    runs = PackedRuns.of(row["group_ids"], row["parent_ids"])
    # a prompt, then its completions, twice
    assert runs.runs == [(0, 9, None), (9, 14, 0), (14, 20, 0), (20, 24, 0), (24, 31, None), (31, 34, 4), (34, 42, 4)]
    masked, masked_grads = row_logprobs(model, row, None)
    with activations.keeping_less():
        blocked, blocked_grads = row_logprobs(model, row, runs)
    assert torch.allclose(masked, blocked, atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(masked_grads, blocked_grads))


def test_a_row_not_packed_as_art_packs_keeps_its_mask():
    from summrl.backends.embedded.attention import PackedRuns

    row = packed_row([6], [[4, 4]])
    split = row["group_ids"].clone()
    split[0, -2:] = 100  # the prompt's group again, after a completion
    assert PackedRuns.of(split, row["parent_ids"]) is None
    orphan = row["parent_ids"].clone()
    orphan[0, 6:10] = 55  # completions of a prompt that is not in the row
    assert PackedRuns.of(row["group_ids"], orphan) is None
    assert PackedRuns.of(row["group_ids"].repeat(2, 1), row["parent_ids"].repeat(2, 1)) is None  # two rows


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not in this PyTorch")
@pytest.mark.parametrize("mkl_input_grad", [True, False], ids=["input-grad-on-mkl", "input-grad-on-onednn"])
def test_onednn_linears_give_peft_outputs_and_gradients_and_sample_from_packed_weights(monkeypatch, mkl_input_grad):
    """linear.Linears: the frozen products on oneDNN (the backward pass's input gradient on MKL or oneDNN, as the
    processor decides) and LoRA's product added in place give peft's outputs and gradients; packed for sampling, the
    weights give the same logits, and unpacking returns to the weights as they are."""
    from summrl.backends.embedded import linear
    from summrl.backends.embedded.linear import Linears

    monkeypatch.setattr(linear, "_mkl_input_grad", lambda: mkl_input_grad)

    plain, fast = tiny_lora_llama(), tiny_lora_llama()
    linears = Linears(fast)
    assert len(linears.layers) == 2 * 7 + 1  # LoRA's base layers and the head
    ids = torch.randint(0, 97, (2, 12))
    outs, grads = [], []
    for model in (plain, fast):
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits
        logits.logsumexp(-1).sum().backward()
        outs.append(logits.detach())
        grads.append([q.grad for q in model.parameters() if q.requires_grad])
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(*grads))
    with torch.no_grad():
        linears.pack()
        packed = fast(input_ids=ids).logits
        fast.merge_adapter()  # sampling reads merged weights: packs are made after a merge, dropped before an unmerge
        linears.unpack()
        linears.pack()
        merged = fast(input_ids=ids).logits
        linears.unpack()
        fast.unmerge_adapter()
    assert torch.allclose(packed, outs[1], atol=1e-5) and torch.allclose(merged, outs[1], atol=1e-4)
    assert all("_packed" not in layer.__dict__ for layer in linears.layers)


def test_token_logprobs_gradient_made_with_the_logits_is_autograds():
    from summrl.backends.embedded.engine import LOGIT_CHUNK_ROWS, token_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False).requires_grad_(False)
    rows = LOGIT_CHUNK_ROWS + 40  # two chunks
    hidden = torch.randn(rows, 16, requires_grad=True)
    targets = torch.randint(0, 300, (rows,))
    upstream = torch.randn(rows)
    (token_logprobs(head, hidden, targets) * upstream).sum().backward()
    made = hidden.grad.clone()
    hidden.grad = None
    reference = torch.log_softmax(hidden @ head.weight.T, -1).gather(1, targets[:, None]).squeeze(1)
    (reference * upstream).sum().backward()
    assert torch.allclose(token_logprobs(head, hidden.detach(), targets), reference.detach(), atol=1e-5)
    assert torch.allclose(made, hidden.grad, rtol=1e-4, atol=1e-6)


MKL_PROBE = """
import ctypes, importlib.util, json, os
import summrl
from summrl import mkl_isa
import torch
address = lambda lib: ctypes.cast(lib.mkl_serv_intel_cpu_true, ctypes.c_void_p).value
try:  # what libtorch's MKL binds the name to: the process's global symbols first, then its own
    bound = address(ctypes.CDLL(None))
except AttributeError:
    bound = None
own = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
spec = importlib.util.find_spec("summrl._mkl_isa")
a, b = torch.randn(300, 200, dtype=torch.float64), torch.randn(200, 100, dtype=torch.float64)
print(json.dumps({"active": mkl_isa.ACTIVE, "bound_to_ours": bound is not None and bound == address(ctypes.CDLL(spec.origin)),
                  "bound_elsewhere": bound is not None and bound != address(own), "mkl_own_answer": own.mkl_serv_intel_cpu_true(),
                  "error": ((a.float() @ b.float()).double() - a @ b).abs().max().item()}))
"""


def _amd_x86_64() -> bool:
    from summrl.mkl_isa import _amd

    return sys.platform == "linux" and __import__("os").uname().machine == "x86_64" and _amd()


def test_the_two_level_cdf_draws_the_tokens_the_full_cdf_draws():
    """RowSeededSampling finds a row's draw among its blocks' sums, then inside the block: the token the full
    float64 CDF gives for the same seed (inverse-CDF sampling, written out here), and the same normalizer. Vocabularies
    of whole blocks and not, impossible (-inf) tokens, flat and peaked scores."""
    from summrl.backends.embedded.engine import RowSeededSampling

    def full_cdf(scores: torch.Tensor, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
        draws = torch.cat([torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                           for s in seeds])
        picked = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        return picked, torch.logsumexp(scores.double(), dim=-1)

    torch.manual_seed(0)
    block, drawn = RowSeededSampling.BLOCK, set()
    for vocab in (4 * block, 3 * block + 7, 5):
        for spread in (0.1, 1.0, 8.0):
            scores = torch.randn(12, vocab) * spread
            scores[::3, vocab // 2:] = -torch.inf
            seeds = list(range(len(scores)))
            sampler = RowSeededSampling(seeds)
            picked, norm = full_cdf(scores, seeds)
            assert torch.equal(sampler(scores), picked)
            torch.testing.assert_close(sampler.log_norm, norm, rtol=0, atol=1e-7)  # float32 exponentials
            drawn.update((picked // block).tolist())
    assert len(drawn) >= 4  # draws landed in every block of the widest vocabulary, not only the first


def test_the_engine_samples_in_bfloat16(tiny_weights):
    """backend.dtype=bfloat16 (serving on a CPU with bfloat16 units): rows that share a prompt and a row of a shorter
    one sample through the shared-prefix attention, whose fused kernel gives float32 log-sum-exps for bfloat16 inputs
    (its output went to the next layer as float32, which oneDNN refused)."""
    from summrl.backends.embedded.compute import on_compute_thread
    from summrl.backends.embedded.engine import Engine, SamplingParams
    from summrl.config import LoraConfig

    def sample():
        engine = Engine(base_model="tiny", weights=tiny_weights.split("=", 1)[1], lora=LoraConfig(), dtype="bfloat16")
        long, short = list(range(100, 140)), list(range(200, 210))
        return engine.generate([long, long, short], SamplingParams(max_tokens=6), seeds=[1, 2, 3])

    rows = on_compute_thread(sample)
    assert [len(r.token_ids) for r in rows] == [6, 6, 6]  # random weights: no end-of-text within 6 tokens
    assert all(math.isfinite(lp) and lp <= 0 for r in rows for lp in r.logprobs)


@pytest.mark.skipif(not _amd_x86_64(), reason="MKL's vendor check only matters on AMD x86-64 processors")
def test_mkl_on_amd_calls_summrls_vendor_answer_unless_told_not_to():
    """summrl._mkl_isa, loaded by `import summrl` before PyTorch, is the definition MKL's vendor check binds to (it
    answers Intel, so MKL picks kernels by instruction set; MKL's own answers 0 here); products stay exact to
    float32; SUMMRL_MKL_ISA=0 leaves MKL its own."""
    import importlib.util

    if importlib.util.find_spec("summrl._mkl_isa") is None:
        pytest.fail("summrl._mkl_isa is not built: reinstall with a C compiler (pip install -e .)")

    def probe(**env: str) -> dict:
        import os

        out = subprocess.run([sys.executable, "-c", MKL_PROBE], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, **env})
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.splitlines()[-1])

    on, off = probe(), probe(SUMMRL_MKL_ISA="0")
    assert on["active"] and on["bound_to_ours"] and on["bound_elsewhere"], on
    assert not off["active"] and not off["bound_to_ours"] and not off["bound_elsewhere"], off
    assert on["mkl_own_answer"] == 0  # MKL's own check says "not Intel" here: the reason for the extension
    assert on["error"] < 1e-3 and off["error"] < 1e-3
