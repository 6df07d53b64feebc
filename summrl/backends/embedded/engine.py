"""The embedded engine: one in-process causal LM with a LoRA adapter that both samples and trains.

Generation shares work the way a group's rollouts allow it: requests that arrive together are run
as one ``generate`` call, and requests with the same prompt (a group's rollouts) share one prefill
and one copy of its KV cache, which all their rows attend to. Training reuses ART's preprocessing (tokenize and pack, one
shared prompt per group) and ART's loss; it computes the vocabulary projection only at completion
positions, which is where the loss needs log-probabilities.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from summrl import mkl_isa
from summrl.backends.embedded import activations
from summrl.backends.embedded.attention import ATTENTION, PackedRuns, SharedPrefix, register_attention
from summrl.backends.embedded.linear import Linears, onednn_usable
from summrl.data import resolve_path
from summrl.errors import ConfigError, first_line
from summrl.prompt import chat_token_ids

# peft looks the base model up again at every save_pretrained to see whether the vocabulary changed; offline, or
# with a local model, it warns at each checkpoint. LoRA here never changes the vocabulary: noise to a user.
warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning, module="peft")

if TYPE_CHECKING:
    from summrl.config import LoraConfig


def resolve_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def dequantized_cache(gguf: Path, dtype: torch.dtype) -> Path:
    """Where a .gguf file's de-quantized weights and tokenizer are kept after the first load.

    transformers de-quantizes a GGUF file on every load (about 15 s for SmolLM2-135M on 2 cores, most of a
    short run's start); the saved copy loads in about a second. Keyed by the file's content (sha256, about 0.1 s
    for 100 MB), the dtype and the transformers version: every copy of one file (another venv, a fresh clone)
    shares one cache entry, and a changed file or library makes a new one.
    ``$SUMMRL_CACHE_DIR`` moves the cache (default ``~/.cache/summrl``).
    """
    return _dequantized_entry(gguf, _file_sha256(gguf), dtype)


def saved_dequantized(gguf: Path) -> Optional[Path]:
    """A de-quantized copy of ``gguf`` already saved, in any dtype (each holds the same tokenizer), or None."""
    content = _file_sha256(gguf)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        entry = _dequantized_entry(gguf, content, dtype)
        if (entry / "config.json").exists():
            return entry
    return None


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _dequantized_entry(gguf: Path, content: str, dtype: torch.dtype) -> Path:
    import transformers  # heavy: kept off the import path of this module's light users

    # "tokenizer-2": entries saved before the tokenizer was converted by its own model (:func:`gguf_tokenizer`) hold
    # transformers' CodeLlama one, and are not reused.
    key = f"{content}:{dtype}:{transformers.__version__}:tokenizer-2"
    root = Path(os.environ.get("SUMMRL_CACHE_DIR") or Path.home() / ".cache" / "summrl")
    return root / "dequantized" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _save_dequantized(tokenizer: Any, model: Any, target: Path) -> None:
    """Write the copy beside its final place, then rename it in: a concurrent job sees all of it or none."""
    partial: Optional[Path] = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        tokenizer.save_pretrained(partial)
        model.save_pretrained(partial)
        os.replace(partial, target)
    except OSError:  # another job saved it first, or no room or no write access: the run goes on without a copy
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)


def sorted_sets(config: Any) -> Any:
    """A peft config whose set fields (``target_modules``) are sorted lists. peft writes a set in Python's hash order,
    which changes from process to process, so the same adapter's ``adapter_config.json`` would differ run to run."""
    for name, value in list(vars(config).items()):
        if isinstance(value, set):
            setattr(config, name, sorted(value))
    return config


def gguf_tokenizer(path: Path) -> Any:
    """The tokenizer of a .gguf file, converted as the file's tokenizer model says.

    transformers picks the converter by the architecture: a llama-architecture file with a byte-level BPE vocabulary
    (tokenizer.ggml.model "gpt2", as SmolLM2's) gets the SentencePiece llama converter in a CodeLlamaTokenizer. That
    tokenizer adds 5 infilling tokens past the embedding (a text holding "<FILL_ME>" raised IndexError, and left the
    tokenizer encoding every later text with "▁" for spaces), and reads eos from bos. Such a file is converted with
    transformers' GPT-2 converter, with the file's own special tokens; any other file as transformers does it.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.integrations.ggml import GGUF_TO_FAST_CONVERTERS, GGUFGPTConverter, GGUFLlamaConverter
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    read = load_gguf_checkpoint(str(path), return_tensors=False)
    vocab, architecture = read["tokenizer"], read["config"].get("model_type")
    if vocab.get("tokenizer_type") != "gpt2" or GGUF_TO_FAST_CONVERTERS.get(architecture) is not GGUFLlamaConverter:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokens = vocab["tokens"]
    named = {f"{role}_token": tokens[vocab[f"{role}_token_id"]]
             for role in ("bos", "eos", "unk", "pad") if vocab.get(f"{role}_token_id") is not None}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=GGUFGPTConverter(dict(vocab)).converted(), clean_up_tokenization_spaces=False,  # as vLLM
        chat_template=read["tokenizer_config"].get("chat_template"), **named)
    control = [tokens[i] for i, kind in enumerate(vocab.get("token_type", ())) if kind == 3]  # GGUF's CONTROL type
    tokenizer.add_special_tokens({"additional_special_tokens": control})  # one id each, skipped when decoding
    tokenizer.add_tokens(list(vocab.get("added_tokens", ())))  # the file's own added tokens, as transformers adds them
    return tokenizer


def load_causal_lm(base_model: str, weights: Optional[str], dtype: torch.dtype, device: torch.device):
    """Load tokenizer and model from ``weights`` (folder, .gguf file, ``pkg:`` path) or the hub id.
    A .gguf file is de-quantized once and read from :func:`dequantized_cache` after that."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    register_attention()
    kwargs: dict[str, Any] = {}
    cache: Optional[Path] = None
    if weights:
        path = resolve_path(weights)
        if not path.exists():
            raise ConfigError(f"model.weights={weights}: {path} does not exist: point it at a model folder or .gguf file")
        if path.suffix == ".gguf":
            cache = dequantized_cache(path, dtype)
            if (cache / "config.json").exists():
                source, cache = str(cache), None
            else:
                source, kwargs["gguf_file"] = str(path.parent), path.name
        else:
            source = str(path)
    else:
        source = base_model
    try:
        tokenizer = (gguf_tokenizer(path) if "gguf_file" in kwargs
                     else AutoTokenizer.from_pretrained(source, **kwargs))
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation=ATTENTION, **kwargs)
    except OSError as e:
        raise ConfigError(f"model.weights={weights}: could not load {source!r} ({first_line(e)}): with no "
                          "network, point model.weights at a local folder or .gguf file") from None
    if cache is not None:
        _save_dequantized(tokenizer, model, cache)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model.to(device)



M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 4 * 1024 * 1024


def _glibc() -> Any:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):  # the user's own setting, read by glibc at start, wins
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): nothing to do
        return None


def mmap_threshold(size: int) -> None:
    """Keep the resident size at what a phase needs, not the sum of what every step has freed.

    glibc gives an allocation above its mmap threshold a mapping of its own, returned to the system when freed; smaller
    ones come from heap arenas, which keep what is freed. By default the threshold rises to the size of each freed
    mapping (up to 32 MB), so after the first step the large tensors of generation and training land in the arenas
    and the resident size grew with every step: experiment=local measured 0.8 GB loaded, 6.5 GB after step 1, 9.0 GB
    after step 2, 12 GB by step 16. A fixed threshold stops that rise, and ``release_freed`` gives the arenas back
    after each generate call and each trained row.

    The threshold is 4 MB. Below it a row's tensors reuse the arena memory its earlier tensors freed; each mapping is
    page-faulted in afresh (a 992-token row allocates about 4.5 GB over its forward and backward passes): with a
    128 KB threshold training took 10.1 s where 4 MB takes 7.3 s (one fixed 2-group batch), at a peak of 2.41 and
    2.87 GB. Generation reallocates its caches at every decode step: 65% slower at 128 KB."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, size)


def release_freed() -> None:
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _reserved_layer_class() -> type:  # defined on first use: transformers is heavy to import
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A KV cache layer over buffers with room for the tokens still to come, written in place.

        ``DynamicLayer.update`` appends with ``torch.cat``, which copies the layer's whole cache at every decode step:
        for 8 rows of a 480-token prompt that was 68 of the 95 ms of SmolLM2-135M's decode step (torch.profiler,
        2 cores). The values and the attention over them are unchanged; only the copies go.
        """

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
            super().__init__()
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._keys, self._values = keys, values
            self.keys, self.values = keys[..., :filled, :], values[..., :filled, :]

        def update(self, key_states, value_states, cache_kwargs=None):
            start = self.keys.shape[-2]
            end = start + key_states.shape[-2]
            if end > self._keys.shape[-2]:  # past the reservation: grow as DynamicLayer does
                self.keys, self.values = self.keys.contiguous(), self.values.contiguous()
                return super().update(key_states, value_states, cache_kwargs)
            self._keys[..., start:end, :] = key_states
            self._values[..., start:end, :] = value_states
            self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
            return self.keys, self.values

    return ReservedLayer


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    # OpenAI's response_format, as JSON: {"type": "json_object"} or {"type": "json_schema", ...}; None = free text
    response_format: Optional[str] = None

    def key(self) -> tuple:
        return (self.temperature, self.top_p, self.response_format)


class RowSeededSampling:
    """Draws each row's next token from softmax(scores) with the row's own ``torch.Generator``.

    The seed fixes the row's draws whatever else shares its batch (the OpenAI ``seed`` parameter, as vLLM honours it);
    the logits themselves vary around 1e-5 with the batch's rows, which is why the batcher composes its generate calls
    the same way every time (``server.Batcher``). After a draw, ``log_norm`` holds each row's log-sum-exp of the
    scores (float64-summed), from which a token's log-probability under them is ``score - log_norm``.
    """

    BLOCK = 256  # vocabulary entries per block of the two-level CDF

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.log_norm: Optional[torch.Tensor] = None
        # The step's full-vocabulary buffers, kept across steps (zero past the vocabulary, to whole blocks): above
        # glibc's mmap threshold each new one was mapped and page-faulted in again (64 rows: 38 MB, 5 ms a step)
        self._weights: Optional[torch.Tensor] = None
        self._wide: Optional[torch.Tensor] = None  # the weights in float64

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        """The drawn token of each row, [rows]."""
        # Inverse-CDF sampling: one uniform draw per row against the cumulative sum of exp(score - max), the
        # unnormalized distribution, accumulated in float64 so that even a token of probability 1e-12 keeps its
        # share; the exponentials are float32 (down to 1e-38). torch.multinomial drew an exponential for every
        # vocabulary entry instead: 0.8 ms a row, 7% of a decode step. The CDF is two-level: the blocks' sums
        # (float64), then the drawn block's entries, which is the full CDF's answer up to float64 rounding. At 64 rows
        # of SmolLM2's 49152 entries the full CDF's draw took 9.2 ms a decode step (cumsum made a 25 MB float64 copy,
        # page-faulted in at every step), the two levels 3.5.
        rows, vocab = scores.shape
        blocks = -(-vocab // self.BLOCK)
        if self._weights is None or self._weights.shape[0] != rows:
            self._weights = torch.zeros(rows, blocks * self.BLOCK, dtype=torch.float32)
            self._wide = torch.zeros(rows, blocks * self.BLOCK, dtype=torch.float64)
        weights = self._weights[:, :vocab].copy_(scores)  # on the CPU, wherever the model runs
        top = weights.amax(dim=-1, keepdim=True)
        weights.sub_(top).exp_()
        by_block = self._wide.copy_(self._weights).view(rows, blocks, self.BLOCK)
        block_cdf = torch.cumsum(by_block.sum(-1), dim=-1)
        total = block_cdf[:, -1]
        self.log_norm = (top.squeeze(1).double() + total.log()).to(scores.device)
        draws = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])
        targets = (draws * total).unsqueeze(1)
        block = torch.searchsorted(block_cdf, targets, right=True).clamp_(max=blocks - 1)
        before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
        inside = by_block.gather(1, block.unsqueeze(2).expand(rows, 1, self.BLOCK)).squeeze(1)
        cdf = torch.cumsum(inside, dim=-1).add_(before)
        picked = block.squeeze(1) * self.BLOCK + torch.searchsorted(cdf, targets, right=True).squeeze(1)
        picked = picked.clamp(max=vocab - 1)
        # float rounding at the very top of the CDF could land on a trailing token of probability 0: take the last
        # token that can be drawn instead
        impossible = weights.gather(1, picked.unsqueeze(1)).squeeze(1) == 0
        for row in impossible.nonzero().flatten().tolist():
            picked[row] = int(weights[row].nonzero().max())
        return picked.to(scores.device)


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int


@dataclass
class Rows:
    """What a caller of ``Engine.generate`` says about the rows of a call as they decode (the embedded server's
    batcher: rows of different requests share a call)."""

    max_tokens: Sequence[int]  # each row's own budget: the call runs to the largest, a row ends at its own
    wanted: Callable[[], Sequence[bool]]  # which rows someone still waits for; the others stop where they are
    done: Optional[Callable[[int, "Completion"], None]] = None  # row i's completion as soon as it ends (not at the
    # call's end); None: only the completions generate returns
    tokens: Optional[Callable[[list[Optional[int]]], None]] = None  # each decode step's token of every row (None for
    # a row that had ended), as it is drawn: streamed replies


class RowGrammar:
    """xgrammar's logits processor for transformers (one grammar matcher a row), fed only the tokens rows drew.

    A row that ends before the others (its own max_tokens, a stop sequence, its client gone) is padded with the pad
    token, EOS for SmolLM2; xgrammar's own processor gave that pad to the row's matcher, which mid-JSON refuses it:
    its assert failed the generate call, and every request batched with that row got a 500."""

    def __init__(self, compiled: Any, rows: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
        self.bitmask = xgr.allocate_token_bitmask(rows, compiled.tokenizer_info.vocab_size)
        self.drawn: Optional[torch.Tensor] = None  # set by the decode loop: the rows that drew their last token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for row, matcher in enumerate(self.matchers):
            if self.drawn is not None and self.drawn[row] and not matcher.is_terminated():
                if not matcher.accept_token(int(input_ids[row, -1])):  # drawn under this mask: a bug if refused
                    raise RuntimeError(f"row {row}: the grammar refused a token drawn under its own mask")
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.bitmask, row)
        if scores.device.type in ("cpu", "cuda"):  # xgrammar masks in place on these two only
            self.xgr.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device))
            return scores
        masked = scores.to("cpu")
        self.xgr.apply_token_bitmask_inplace(masked, self.bitmask)
        return masked.to(scores.device)


class Engine:
    """Owns the model. ``lock`` serializes generation and training: weights change between steps only."""

    def __init__(
        self,
        *,
        base_model: str,
        weights: Optional[str],
        lora: "LoraConfig",
        device: str = "auto",
        dtype: str = "float32",
        num_threads: Optional[int] = None,
        max_string_chars: int = 300,
        chat_template_kwargs: Optional[dict[str, Any]] = None,
    ) -> None:
        from peft import LoraConfig, get_peft_model

        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = resolve_device(device)
        self.dtype = getattr(torch, dtype)
        self.tokenizer, base = load_causal_lm(base_model, weights, self.dtype, self.device)
        try:
            self.model = get_peft_model(
                base,
                LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
            )
        except ValueError as e:  # peft's NoMatchingPeftModuleError: a module name the model lacks
            linear = sorted({name.rsplit(".", 1)[-1] for name, module in base.named_modules()
                             if isinstance(module, torch.nn.Linear)})
            raise ConfigError(f"model.lora.target_modules={list(lora.target_modules)}: {first_line(e)}; this "
                              f"model's linear layers are {', '.join(linear)}") from None
        sorted_sets(self.model.peft_config["default"])  # after the layers are matched: the checkpoints' config
        activations.install(self.model)
        # the frozen products on oneDNN where it runs (a CPU); elsewhere PyTorch's own
        self.linears = Linears(self.model) if onednn_usable(self.device, self.dtype) else None
        self.model.eval()
        self._settle_mkl()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0
        )
        # "sft" or "rl": what the optimizer state was last stepped for (saved with it); None: not known
        self.trained_as: Optional[str] = None
        self.lock = threading.Lock()
        self.eos_ids = self._eos_ids()
        self._merged = False  # LoRA folded into the base weights: faster sampling, undone before training
        self._grammars: dict[str, Any] = {}
        self._grammar_compiler: Any = None
        self.max_string_chars = max_string_chars
        self.chat_template_kwargs = chat_template_kwargs or {}  # model.chat_template_kwargs
        # (batch rows, median ms per decode step) of the latest generate calls: summrl.perf step reads it
        self.decode_ms: deque[tuple[int, float]] = deque(maxlen=256)

    def _settle_mkl(self) -> None:
        """Run MKL's first product of the process here, on the compute thread, before anything is sampled.

        With MKL told that an AMD processor is Intel's (``summrl/mkl_isa.py``), the first call of a process now and then
        (5 of 65 fresh processes, on a Zen 4) gave another rotary table than every later call: the first prompt's
        prefill then differed from layer 0's keys on, and so did that prompt's summaries for a seed (step 0's val of
        ``experiment=local`` now and then). With the rotary embedding run once first: 0 of 115.
        ``python -m summrl.perf first-sample [--unsettled]`` counts it.
        """
        base = self.model.get_base_model()
        rotary = getattr(getattr(base, "model", None), "rotary_emb", None)
        if not (mkl_isa.ACTIVE and self.device.type == "cpu" and rotary is not None):
            return
        try:
            with torch.no_grad():
                rotary(torch.zeros(1, 4, base.config.hidden_size, dtype=self.dtype), torch.arange(512)[None])
        except (TypeError, RuntimeError):  # a rotary module that takes other arguments: load without the warm-up
            pass

    def grammar(self, response_format: str) -> Any:
        """A compiled xgrammar grammar for an OpenAI response_format, so JSON replies are valid by construction."""
        import json as _json

        import xgrammar as xgr

        if response_format not in self._grammars:
            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.model.get_base_model().config.vocab_size)
                self._grammar_compiler = xgr.GrammarCompiler(info)
            spec = _json.loads(response_format)
            kind = spec.get("type")
            if kind == "json_object":
                compiled = self._grammar_compiler.compile_builtin_json_grammar()
            elif kind == "json_schema":
                schema = (spec.get("json_schema") or {}).get("schema")
                if not isinstance(schema, dict):
                    raise ValueError("response_format json_schema needs json_schema.schema")
                bounded = bound_strings(schema, self.max_string_chars)
                # At most 2 whitespace characters in a row: with free whitespace a small model can emit newlines
                # until max_tokens (seen with SmolLM2 as RULER judge: 630 blank lines, then a cut-off reply).
                try:
                    compiled = self._grammar_compiler.compile_json_schema(_json.dumps(bounded), max_whitespace_cnt=2)
                except RuntimeError as e:  # xgrammar's C++ message, after its "[time] file.cc:line: " location
                    reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())
                    raise ValueError(f"json_schema.schema can't be compiled to a grammar: {reason}") from None
            else:
                raise ValueError(f"unsupported response_format type {kind!r}; use json_object or json_schema")
            self._grammars[response_format] = compiled
        return self._grammars[response_format]

    def _set_merged(self, merged: bool) -> None:
        if merged != self._merged:
            self._unpack()  # the packed copies are of the weights as they are now
        if merged and not self._merged:
            self.model.merge_adapter()
        elif not merged and self._merged:
            self.model.unmerge_adapter()
        self._merged = merged

    def _unpack(self) -> None:
        if self.linears is not None:
            self.linears.unpack()

    def _train_as(self, mode: str) -> None:
        """ART's trainer clears AdamW's state when training switches between SFT and RL (art/unsloth/train.py,
        ``_reset_optimizer_if_mode_changed``): GRPO after an SFT stage starts from fresh moments. It went on with
        SFT's (their bias correction at SFT's step count): its first update was another than LocalBackend's."""
        if self.trained_as not in (None, mode):
            self.optimizer.state.clear()
        self.trained_as = mode

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos])
        return sorted(i for i in ids if i is not None)

    # ------------------------------------------------------------------ inference

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return chat_token_ids(self.tokenizer, messages, **self.chat_template_kwargs)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams, use_lora: bool = True,
                 seeds: Optional[list[Optional[int]]] = None, rows: Optional[Rows] = None) -> list[Completion]:
        """Sample one completion per prompt. Identical prompts share a single prefill.

        ``seeds[i]`` fixes row i's sampling (None: drawn from torch's global generator). ``rows``: each row's own
        token budget, which rows are still wanted (a row no longer wanted stops there, and a call with none left
        ends) and a callback for each row's completion as it ends. A row's tokens are the same either way.
        """
        seeds = seeds or [None] * len(prompts)
        # Unseeded rows still get their own generator, seeded from the global one: one sampling path.
        seeds = [int(torch.randint(2**62, ())) if seed is None else seed for seed in seeds]
        with self.lock:
            mmap_threshold(MMAP_THRESHOLD)
            try:
                self._set_merged(use_lora)
                if self.linears is not None and not self.linears.packed:
                    # each packed weight a mapping of its own, returned whole when unpacked: 540 MB of 0.4 to 3.5 MB
                    # pieces left holes in the arenas that later steps' tensors did not fill
                    mmap_threshold(128 * 1024)
                    self.linears.pack()
                    mmap_threshold(MMAP_THRESHOLD)
                if use_lora:
                    return self._generate(prompts, params, seeds, rows)
                with self.model.disable_adapter():
                    return self._generate(prompts, params, seeds, rows)
            finally:
                release_freed()  # the KV caches' arena memory, before anything else runs

    def _generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int],
                  rows: Optional[Rows] = None) -> list[Completion]:
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        unique: list[tuple[int, ...]] = list(dict.fromkeys(tuple(p) for p in prompts))
        row_of = [unique.index(tuple(p)) for p in prompts]
        width = max(len(p) for p in unique)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        position = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        cache, prefix = self._prefill(unique, row_of, width, params.max_tokens)
        processors = LogitsProcessorList()
        if params.response_format:
            processors.append(RowGrammar(self.grammar(params.response_format), len(prompts)))
        if params.temperature > 0 and params.temperature != 1.0:  # 0: greedy; 1: the logits as they are
            processors.append(TemperatureLogitsWarper(params.temperature))
        if params.temperature > 0 and params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        sample = RowSeededSampling(seeds) if params.temperature > 0 else None
        budgets = list(rows.max_tokens) if rows is not None else [params.max_tokens] * len(prompts)

        def completion(row: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> Completion:
            """Row ``row``'s completion from its tokens so far: cut at its end (EOS) or at its budget."""
            row_tokens, finish = tokens[: budgets[row]].tolist(), "length"
            for i, token in enumerate(row_tokens):
                if token in self.eos_ids:
                    row_tokens, finish = row_tokens[: i + 1], "stop"
                    break
            return Completion(token_ids=row_tokens, logprobs=logprobs[: len(row_tokens)].tolist(),
                              finish_reason=finish, prompt_tokens=len(unique[row_of[row]]))

        ended = None
        if rows is not None and rows.done is not None:
            def ended(row: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
                rows.done(row, completion(row, tokens, logprobs))

        tokens, logprobs = self._decode(ids, position, cache, prefix, processors, sample, params.max_tokens,
                                        len(prompts), budgets, None if rows is None else rows.wanted, ended,
                                        None if rows is None else rows.tokens)
        return [completion(row, tokens[row], logprobs[row]) for row in range(len(prompts))]

    def _prefill(self, unique: list[tuple[int, ...]], row_of: list[int], width: int,
                 reserve_tokens: int) -> tuple[Any, SharedPrefix]:
        """The decode step's caches: each distinct prompt's keys and values but its last token, stored once
        (``SharedPrefix``), and an empty cache per row with room for ``reserve_tokens``, its own tokens to come.

        Each distinct prompt is run alone (the decoder only: no logits are needed there). Batched over padded
        prompts, the same work took 10.7 s for 16 documents of about 480 tokens that alone take 0.5 s each on 2
        cores: the padding mask takes attention off its causal fast path, and the batch's activations do not stay in
        cache. Run alone, a prompt is also computed as the training forward computes it."""
        from transformers import DynamicCache

        decoder = self.model.get_base_model().model
        config = decoder.config
        kv_heads = config.num_key_value_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(decoder.parameters()).dtype
        layers = config.num_hidden_layers

        def zeros(count: int, length: int) -> list[torch.Tensor]:
            return [torch.zeros(count, kv_heads, length, dim, dtype=dtype, device=self.device) for _ in range(layers)]

        prompt_keys, prompt_values = zeros(len(unique), width - 1), zeros(len(unique), width - 1)
        for index, prompt in enumerate(unique):
            if len(prompt) < 2:
                continue
            alone = DynamicCache()
            decoder(input_ids=torch.tensor([prompt[:-1]], device=self.device), past_key_values=alone, use_cache=True)
            for layer, computed in enumerate(alone.layers):
                prompt_keys[layer][index, :, width - len(prompt):] = computed.keys[0]
                prompt_values[layer][index, :, width - len(prompt):] = computed.values[0]
            del alone
        mask = None
        if any(len(p) < width for p in unique):
            mask = torch.tensor([[False] * (width - len(p)) + [True] * (len(p) - 1) for p in unique],
                                device=self.device)[:, None, None, :]
        slot, per_prompt = SharedPrefix.layout(row_of, len(unique))
        prefix = SharedPrefix(prompt_keys, prompt_values, mask, slot.to(self.device), per_prompt)
        # the rows' own tokens: only what was written is read (the prompts' padding must be zeros: a masked key's
        # weight is 0, and 0 * NaN is not)
        own = (len(row_of), kv_heads, reserve_tokens, dim)
        own_keys = [torch.empty(own, dtype=dtype, device=self.device) for _ in range(layers)]
        own_values = [torch.empty(own, dtype=dtype, device=self.device) for _ in range(layers)]
        cache = DynamicCache()
        ReservedLayer = _reserved_layer_class()
        cache.layers = [ReservedLayer(keys, values, 0) for keys, values in zip(own_keys, own_values)]
        return cache, prefix

    def _decode(self, input_ids: torch.Tensor, position: torch.Tensor, cache: Any, prefix: SharedPrefix,
                processors: Any, sample: Optional[RowSeededSampling], max_tokens: int,
                rows: int, budgets: list[int], wanted: Optional[Callable[[], Sequence[bool]]] = None,
                ended: Optional[Callable[[int, torch.Tensor, torch.Tensor], None]] = None,
                drawn: Optional[Callable[[list[Optional[int]]], None]] = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode up to ``max_tokens`` per row from a prefilled cache: (tokens, log-probabilities), [rows, steps].

        The loop ``generate()`` runs over processed scores (``sample`` draws from them; None: greedy), without its
        per-step bookkeeping: the same tokens. Each token's log-probability is taken under the
        model's own distribution (before temperature), as vLLM reports it, when its step ends rather than from every
        step's full-vocabulary logits kept to the end (8 rows x 128 steps of SmolLM2's vocabulary: 200 MB).
        The first step feeds each prompt's last token; the prompts' padding is masked in ``prefix``, so the rows'
        own tokens need no mask. A row past its own budget (``budgets``), or one ``wanted()`` gives up on, is padded
        from there, as a finished row is (and its budget lowered to what it has: its completion ends there);
        ``ended(row, tokens, logprobs)`` gets each row's tokens when it ends (given up on included), and
        ``drawn(tokens)`` each step's tokens as they are drawn (None for a row that has ended).
        """
        pad = self.tokenizer.pad_token_id
        eos = torch.tensor(self.eos_ids, device=self.device)
        running = torch.ones(rows, dtype=torch.bool, device=self.device)
        last = input_ids[:, -1]
        budget = torch.tensor(budgets, device=self.device)
        tokens, logprobs, times = [], [], [time.perf_counter()]

        def report(rows: torch.Tensor) -> None:
            """``ended`` for each of ``rows`` (a mask), with its tokens so far."""
            if ended is not None and rows.any():
                so_far, so_far_logprobs = torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)
                for row in rows.nonzero().flatten().tolist():
                    ended(row, so_far[row], so_far_logprobs[row])

        for step in range(max_tokens):
            if wanted is not None:
                keep = torch.tensor(list(wanted()), dtype=torch.bool, device=self.device)
                given_up, running = running & ~keep, running & keep
                for row in given_up.nonzero().flatten().tolist():
                    budgets[row] = len(tokens)  # its completion ends here, not at the padding drawn after
                if tokens:  # (a stop sequence drawn: answered now)
                    report(given_up)
                if not running.any():
                    break
            logits = self.model(input_ids=last[:, None], position_ids=position[:, None], past_key_values=cache,
                                use_cache=True, logits_to_keep=1, shared_prefix=prefix).logits[:, -1].float()
            scores = processors(input_ids, logits.clone()) if processors else logits
            picked = sample(scores) if sample is not None else scores.argmax(-1)
            picked = torch.where(running, picked, pad)  # a finished row is padded, as generate() pads it
            for processor in processors:
                if isinstance(processor, RowGrammar):
                    processor.drawn = running.clone()  # the rows whose next input is their own token
            # under the model's own distribution: the sampler's normalizer when it drew from the logits as they are
            norm = sample.log_norm if sample is not None and scores is logits else torch.logsumexp(logits, dim=-1)
            logprobs.append((logits.gather(1, picked[:, None]).squeeze(1) - norm).float())
            tokens.append(picked)
            if drawn is not None:
                drawn([token if live else None for token, live in zip(picked.tolist(), running.tolist())])
            finished = running & (torch.isin(picked, eos) | (budget <= step + 1))
            running &= ~finished
            report(finished)
            times.append(time.perf_counter())
            if not running.any():
                break
            input_ids = torch.cat([input_ids, picked[:, None]], dim=1)
            position, last = position + 1, picked
        gaps = sorted(b - a for a, b in zip(times[1:], times[2:]))  # decode steps after the first
        if gaps:
            self.decode_ms.append((rows, 1000 * gaps[len(gaps) // 2]))
        if not tokens:  # no row wanted before the first step
            return input_ids.new_full((rows, 0), pad), torch.zeros(rows, 0)
        return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)

    @property
    def context_length(self) -> Optional[int]:
        """The most tokens, prompt and completion together, the model was built for (None: the config does not say)."""
        return getattr(self.model.get_base_model().config, "max_position_embeddings", None)

    def decode(self, token_ids: list[int]) -> str:
        """The tokens' text as vLLM returns it: special tokens skipped, no clean-up of spaces. (SmolLM2's tokenizer
        asks for BERT-era clean-up, which turns " 's" into "'s" and " ." into ".": the text is then not the tokens'
        and cannot be streamed: a piece's clean-up depends on the tokens after it.)"""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_bytes(self, token: int) -> list[int]:
        """The token's own bytes, as OpenAI's logprobs ``bytes`` are: joined, they are the reply's UTF-8. A token that
        holds part of a character (an emoji, CJK) decoded alone is U+FFFD; a byte-level BPE token's characters map
        back to its bytes (GPT-2's table)."""
        table = _byte_level_table(self.tokenizer)
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if table is not None and isinstance(piece, str) and piece and all(c in table for c in piece):
            return [table[c] for c in piece]
        return list(self.tokenizer.decode([token], clean_up_tokenization_spaces=False).encode("utf-8"))

    # ------------------------------------------------------------------ training

    def train_packed(self, packed: dict, config: Any, dev_config: dict,
                     reference: Optional[Path] = None) -> list[dict[str, float]]:
        """One optimizer step per packed sequence, as ART's Unsloth trainer does. Returns metrics per step.

        With a KL penalty the reference log-probabilities come from the same model with its LoRA adapter
        disabled (the base model), or with checkpoint ``reference``'s adapter in place of its own: one extra
        forward pass without gradients per packed sequence, as LocalBackend does.
        """
        from art.loss import loss_fn

        metrics = []
        rows = [unpadded({k: v[row : row + 1].to(self.device) for k, v in packed.items() if isinstance(v, torch.Tensor)})
                for row in range(packed["tokens"].shape[0])]
        clipped = tokens = 0
        with self.lock:
            mmap_threshold(MMAP_THRESHOLD)
            self._set_merged(False)
            self._unpack()  # sampling's packed weights: not needed to train, and out of training's peak
            release_freed()
            refs = self._reference_logprobs(rows, reference) if dev_config.get("kl_penalty_coef", 0.0) > 0 else None
            self._train_as("rl")
            self.model.train()
            try:
                for param_group in self.optimizer.param_groups:
                    param_group["lr"] = config.learning_rate
                for row, inputs in enumerate(rows):
                    new_logprobs = self.completion_logprobs(inputs)
                    loss = loss_fn(inputs, new_logprobs, None if refs is None else refs[row], None, dev_config)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.policy_loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        [p for p in self.model.parameters() if p.requires_grad], max_norm=1.0
                    )
                    self.optimizer.step()
                    release_freed()  # the row's activations: the next row would not fit its own among them
                    row_clipped, row_tokens = clip_counts(inputs, new_logprobs.detach(), dev_config)
                    clipped, tokens = clipped + row_clipped, tokens + row_tokens
                    step_metrics = {
                        "loss/train": float(loss.policy_loss.detach()),
                        "loss/grad_norm": float(grad_norm),
                        "loss/learning_rate": float(self.optimizer.param_groups[0]["lr"]),
                        "loss/probs_corr": float(loss.probs_corr.detach()),
                    }
                    if loss.kl_policy_ref is not None:
                        step_metrics["loss/kl_policy_ref"] = float(loss.kl_policy_ref)
                    metrics.append(step_metrics)
            finally:
                self.optimizer.zero_grad(set_to_none=True)
                self.model.eval()
        for step_metrics in metrics:  # the step's share, weighted by tokens (ART averages rows: all rows hold it)
            step_metrics["loss/clipped_fraction"] = clipped / max(tokens, 1)
        return metrics

    @torch.no_grad()
    def _reference_logprobs(self, rows: list[dict], reference: Optional[Path]) -> list[torch.Tensor]:
        """Each packed row's log-probs under the KL reference (eval mode: no dropout): the base model, or the
        adapter of checkpoint ``reference`` swapped in for the pass and the trained one put back."""
        self.model.eval()
        if reference is None:
            with self.model.disable_adapter():
                return [self.completion_logprobs(inputs) for inputs in rows]
        own = self.lora_state()
        self._load_adapter(reference)
        try:
            return [self.completion_logprobs(inputs) for inputs in rows]
        finally:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, own)

    def completion_logprobs(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probability of each next token, computed only where the next token is a completion token.

        Position i holds log p(token[i+1] | tokens[..i]), ART's convention; elsewhere the value is 0
        and the loss masks it out. The attention mask lets each completion see only its own tokens
        and its group's shared prompt (ART's group_ids / parent_ids).
        """
        tokens, group_ids, parent_ids = inputs["tokens"], inputs["group_ids"], inputs["parent_ids"]
        runs = PackedRuns.of(group_ids, parent_ids)  # the same attention, a run at a time
        attention = None
        if runs is None:
            seq_len = tokens.shape[1]
            causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=tokens.device).tril()
            same = ((group_ids.unsqueeze(2) == group_ids.unsqueeze(1))
                    | (parent_ids.unsqueeze(2) == group_ids.unsqueeze(1)))
            attention = (causal & same).unsqueeze(1)  # [B, 1, S, S], True = may attend
        with activations.keeping_less():
            hidden = self.model.get_base_model().model(
                input_ids=tokens, attention_mask=attention, position_ids=inputs["input_pos"], use_cache=False,
                packed_runs=runs,
            ).last_hidden_state
        needed = torch.nn.functional.pad(inputs["assistant_mask"][:, 1:], (0, 1), value=False)
        next_tokens = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=0)
        picked = token_logprobs(self.model.get_output_embeddings(), hidden[needed], next_tokens[needed])
        out = torch.zeros(tokens.shape, dtype=picked.dtype, device=tokens.device)
        out[needed] = picked
        return out

    def chat_sample(self, messages: list[dict]) -> tuple[list[int], int]:
        """An SFT sample's token ids and the length of its prompt (everything before the last, assistant, turn)."""
        prompt = self.encode_chat(messages[:-1])
        full = chat_token_ids(self.tokenizer, messages, add_generation_prompt=False, **self.chat_template_kwargs)
        if full[: len(prompt)] != prompt:  # a template that re-renders earlier turns: append the reply's tokens
            full = prompt + self.tokenizer.encode(messages[-1]["content"], add_special_tokens=False) + self.eos_ids[:1]
        return full, len(prompt)

    def completion_nll(self, samples: list[tuple[list[int], int]], tokens_in_batch: Optional[int] = None) -> torch.Tensor:
        """Cross-entropy of the assistant tokens of ``samples`` (right-padded into one batch), summed and divided by
        ``tokens_in_batch`` (default: their own count, so the mean)."""
        width = max(len(ids) for ids, _ in samples)
        pad = self.tokenizer.pad_token_id
        tokens = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in samples], device=self.device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in samples], device=self.device)
        # target[i] = token[i+1], counted only where token[i+1] belongs to the assistant's reply
        target = torch.zeros_like(mask, dtype=torch.bool)
        for row, (ids, prompt_len) in enumerate(samples):
            target[row, prompt_len - 1 : len(ids) - 1] = True
        with activations.keeping_less():
            hidden = self.model.get_base_model().model(input_ids=tokens, attention_mask=mask,
                                                       use_cache=False).last_hidden_state
        next_tokens = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=0)[target]
        # the projection only where it counts, a chunk at a time
        logprobs = token_logprobs(self.model.get_output_embeddings(), hidden[target], next_tokens)
        return -logprobs.sum() / (tokens_in_batch or logprobs.numel())

    def train_sft(self, batches: list[list[tuple[list[int], int]]], learning_rates: list[float]) -> list[dict[str, float]]:
        """One AdamW step per batch on the LoRA weights: cross-entropy on the assistant tokens only."""
        metrics = []
        with self.lock:
            mmap_threshold(MMAP_THRESHOLD)
            self._set_merged(False)
            self._unpack()  # sampling's packed weights: not needed to train, and out of training's peak
            release_freed()
            self._train_as("sft")
            self.model.train()
            try:
                for batch, lr in zip(batches, learning_rates):
                    for param_group in self.optimizer.param_groups:
                        param_group["lr"] = lr
                    # One sample's activations at a time, its gradient summed into the batch's: the batch's mean
                    # loss and gradient, in the memory of one sample (4 padded samples of a 500-token prompt held
                    # about 3 GB of activations at once; sft=best_of_n peaked at 4.96 GB).
                    self.optimizer.zero_grad(set_to_none=True)
                    tokens = sum(len(ids) - prompt_len for ids, prompt_len in batch)
                    loss = 0.0
                    for sample in batch:
                        part = self.completion_nll([sample], tokens)
                        part.backward()
                        release_freed()
                        loss += float(part.detach())
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        [p for p in self.model.parameters() if p.requires_grad], max_norm=1.0
                    )
                    self.optimizer.step()
                    metrics.append({"loss/train": loss, "loss/grad_norm": float(grad_norm),
                                    "loss/learning_rate": float(lr)})
            finally:
                self.optimizer.zero_grad(set_to_none=True)
                self.model.eval()
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, directory: Path) -> None:
        """Write adapter and optimizer state to ``directory`` atomically (a temp folder, then a rename)."""
        directory = Path(directory)
        tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
        # this step's unfinished writes: a process killed in one left its own (another pid's) for good
        for unfinished in directory.parent.glob(f".{directory.name}.tmp-*"):
            shutil.rmtree(unfinished, ignore_errors=True)
        with self.lock:
            self.model.save_pretrained(str(tmp))
            # with what it was stepped for: a run resumed from SFT's checkpoint clears it for GRPO, as one that went on
            torch.save({**self.optimizer.state_dict(), "summrl_trained_as": self.trained_as}, tmp / "optimizer.pt")
        # on disk before the rename: a power cut leaves the old checkpoint or the new one
        for path in (p for p in tmp.rglob("*") if p.is_file()):
            with path.open("rb") as f:
                os.fsync(f.fileno())
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)

    def _load_adapter(self, directory: Path) -> None:
        """Copy a checkpoint's LoRA weights into the adapter, in place (the optimizer keeps its parameters). A file
        that is not this adapter's (a tensor missing, extra or of another shape) raises before anything is copied:
        peft would copy what fits and skip missing tensors silently."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict
        from safetensors.torch import load_file

        path = Path(directory) / "adapter_model.safetensors"
        state = load_file(str(path), device=str(self.device))
        current = get_peft_model_state_dict(self.model)
        missing, extra = sorted(current.keys() - state.keys()), sorted(state.keys() - current.keys())
        shaped = sorted(k for k in current.keys() & state.keys() if current[k].shape != state[k].shape)
        if missing or extra or shaped:
            first = (f"{shaped[0]} is {list(state[shaped[0]].shape)}, not {list(current[shaped[0]].shape)}" if shaped
                     else f"{(missing or extra)[0]} {'missing' if missing else 'not in this adapter'}")
            raise ValueError(f"{path} is not this model's adapter ({len(missing)} tensors missing, {len(extra)} "
                             f"unknown, {len(shaped)} of another shape; {first})")
        set_peft_model_state_dict(self.model, state)

    def load_checkpoint(self, directory: Path, *, optimizer: bool = True) -> None:
        """The checkpoint's adapter, and (``optimizer``: to train on from it) its AdamW state; a server needs only
        the adapter. The adapter is checked whole before it replaces the one in place."""
        from peft import set_peft_model_state_dict

        directory = Path(directory)
        with self.lock:
            self._set_merged(False)
            previous = self.lora_state()
            try:
                self._load_adapter(directory)
            except BaseException:  # the adapter in place stays whole: a server goes on with it
                set_peft_model_state_dict(self.model, previous)
                raise
            optimizer_path = directory / "optimizer.pt"
            if optimizer and optimizer_path.exists():
                saved = torch.load(optimizer_path, map_location=self.device)
                self.trained_as = saved.pop("summrl_trained_as", None)  # (a checkpoint from before it was saved: None)
                self.optimizer.load_state_dict(saved)

    def lora_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}


def unpadded(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A packed row [1, length] without its trailing padding (group id -1). ART pads every row to the packed length
    (the longest group rounded up to 128 tokens); the padding's activations cost time and memory for nothing: its loss
    is masked out, and the loss divides by the number of completion tokens, not the length."""
    length = row["tokens"].shape[1]
    real = (row["group_ids"][0] != -1).nonzero()
    end = int(real.max()) + 1 if len(real) else 1
    return {k: v[:, :end] if v.dim() >= 2 and v.shape[1] == length else v for k, v in row.items()}


LOGIT_CHUNK_ROWS = 256


def token_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) for each row of ``hidden`` [rows, dim] under the output projection ``head``.

    The [rows, vocabulary] logits exist for one chunk of rows at a time: for SmolLM2's 49k vocabulary a group of
    4 x 128 completion tokens held about 100 MB per copy of its logits, and autograd's loss kept three (logits,
    log-softmax and its gradient). With gradients, a frozen linear head's chunk also makes its rows' gradient with
    respect to the hidden state while its logits exist (``_TokenLogprobs``; recomputing them in the backward pass cost
    a third product with the head and four more passes over the logits); any other head's chunk is recomputed in the
    backward pass (checkpointed) rather than kept."""
    if not torch.is_grad_enabled() or not hidden.requires_grad:
        return torch.cat([_chunk_logprobs(head, h, t)[0] for h, t in
                          zip(hidden.split(LOGIT_CHUNK_ROWS), targets.split(LOGIT_CHUNK_ROWS))])
    if isinstance(head, torch.nn.Linear) and not any(p.requires_grad for p in head.parameters()):
        return _TokenLogprobs.apply(hidden, targets, head)
    from torch.utils.checkpoint import checkpoint

    return torch.cat([checkpoint(lambda h, t: _chunk_logprobs(head, h, t)[0], h, t, use_reentrant=False)
                      for h, t in zip(hidden.split(LOGIT_CHUNK_ROWS), targets.split(LOGIT_CHUNK_ROWS))])


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor,
                    targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p(target), the logits, their log-sum-exp) of one chunk of rows, in float32."""
    logits = head(hidden).float()
    norm = torch.logsumexp(logits, dim=-1)
    return logits.gather(1, targets.unsqueeze(1)).squeeze(1) - norm, logits, norm


class _TokenLogprobs(torch.autograd.Function):
    """log p(target) under a frozen linear head, and its gradient with respect to the hidden state, made in the forward
    pass a chunk at a time: d/dh [z_target - logsumexp(z)] = W_target - softmax(z) @ W."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear) -> torch.Tensor:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden)
        weight = head.weight.detach()
        for start in range(0, hidden.shape[0], LOGIT_CHUNK_ROWS):
            rows = slice(start, start + LOGIT_CHUNK_ROWS)
            out[rows], logits, norm = _chunk_logprobs(head, hidden[rows], targets[rows])
            probs = logits.sub_(norm.unsqueeze(1)).exp_().to(weight.dtype)  # softmax(z), in the logits' place
            grad[rows] = torch.index_select(weight, 0, targets[rows]) - probs @ weight
        ctx.save_for_backward(grad)
        return out

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * upstream.unsqueeze(1).to(grad.dtype), None, None


def bound_strings(schema: Any, max_chars: int) -> Any:
    """A copy of a JSON schema in which every string without a maxLength gets ``max_chars``.

    A small model decoding under a grammar can loop inside a free-text field (RULER's "explanation")
    until max_tokens cuts the JSON; a bound lets the grammar close the string and the object.
    """
    if isinstance(schema, list):
        return [bound_strings(item, max_chars) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bound_strings(value, max_chars) for key, value in schema.items()}
    kind = out.get("type")
    stringy = kind == "string" or (isinstance(kind, list) and "string" in kind)  # ["string", "null"] too
    if stringy and "maxLength" not in out and "enum" not in out and "const" not in out:
        # never below the schema's own minLength: {"minLength": 400} was refused as minLength > maxLength 300
        min_length = out.get("minLength")
        out["maxLength"] = max(max_chars, min_length) if isinstance(min_length, int) else max_chars
    return out


def clip_bounds(dev_config: dict) -> tuple[float, float]:
    """The importance ratio's clip range [1 - epsilon, 1 + epsilon_high], with art/loss.py's defaults."""
    ppo = dev_config.get("ppo", False)
    epsilon = dev_config.get("epsilon", 0.2 if ppo else 1.0)
    epsilon_high = dev_config.get("epsilon_high", None if ppo else 4.0)
    return 1 - epsilon, 1 + (epsilon if epsilon_high is None else epsilon_high)


def clip_counts(inputs: dict, new_logprobs: torch.Tensor, dev_config: dict) -> tuple[int, int]:
    """(clipped, total) completion tokens of a packed row: clipped where the loss bounds the importance ratio.

    The ratio is the one art/loss.py 0.5.18 computes (importance_sampling_level, the
    max_negative_advantage_importance_sampling_weight cap), mirrored here because the loss does not return it;
    a token counts where that ratio lies outside [1 - epsilon, 1 + epsilon_high] or above the cap. For cispo
    these are the tokens whose weight is clipped; for ppo it is PPO's usual clip fraction (the clip removes a
    token's gradient when its advantage points outward).
    """
    from art.loss import shift_tensor
    from art.utils.group_aggregate import group_aggregate

    mask = shift_tensor(inputs["assistant_mask"], False)
    old = shift_tensor(inputs["logprobs"], float("nan"))
    diff = new_logprobs - torch.where(torch.isnan(old), new_logprobs, old)
    ratio = torch.exp(diff)
    level = dev_config.get("importance_sampling_level", "token")
    if level != "token":
        by = shift_tensor(inputs["group_ids"], 0) * mask.to(new_logprobs.dtype)
        sequence = torch.exp(group_aggregate(diff, by=by, reduce="mean"))
        ratio = {"sequence": sequence, "average": (ratio + sequence) / 2,
                 "geometric_average": ratio**0.5 * sequence**0.5}[level]
    low, high = clip_bounds(dev_config)
    cap = dev_config.get("max_negative_advantage_importance_sampling_weight")
    if cap:
        high = min(high, cap)
    return int(((ratio < low) | (ratio > high))[mask].sum()), int(mask.sum())


def round_up(value: int, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


@functools.lru_cache(maxsize=4)
def _byte_level_table(tokenizer: Any) -> Optional[dict[str, int]]:
    """Byte-level BPE's character for each byte, reversed (None: another kind of tokenizer)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ != "ByteLevel":
        return None
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}
