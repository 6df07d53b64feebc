"""The policy's tokenizer, to measure documents in the policy's own tokens (``dataset.max_document_tokens``) before
any model loads.

From ``model.weights`` when set (a folder, a .gguf file or a ``pkg:`` path), else the hub id from the local Hugging
Face cache. A .gguf's tokenizer is read from the embedded engine's de-quantized copy once a load has saved one (about
0.5 s), and converted from the file as the engine converts it before that
(:func:`summrl.backends.embedded.engine.gguf_tokenizer`, 2.5 to 4 s for SmolLM2's on 2 cores): the tokenizer the
engine itself prompts with. It is loaded only when a document is long enough to need it.
"""

from __future__ import annotations

from typing import Any

from summrl.data.document import resolve_path
from summrl.data.split import DataError


# What a training run (or summrl.data) can change when the tokenizer can't be had
TRAIN_FIX = ("set model.weights to a local folder or .gguf file, or turn the limit off with "
             "dataset.max_document_tokens=null")


def load_tokenizer(model: Any, fix: str = TRAIN_FIX) -> Any:
    """The tokenizer of ``model`` (a ModelConfig). Raises DataError naming ``fix`` when it can't be had.

    Loaded on the compute thread: reading a GGUF runs torch's OpenMP, and a second thread that has (asyncio's worker
    in summrl.serve) keeps a second team of OpenMP workers, which slowed every later 16-row decode step by 10%
    (``summrl.backends.embedded.compute`` says why)."""
    from summrl.backends.embedded.compute import on_compute_thread

    return on_compute_thread(_load_tokenizer, model, fix)


def _load_tokenizer(model: Any, fix: str) -> Any:
    from transformers import AutoTokenizer

    source, gguf = model.base_model, None
    if model.weights:
        path = resolve_path(model.weights)
        if not path.exists():
            raise DataError(f"model.weights={model.weights}: {path} does not exist")
        source = str(path)
        if path.suffix == ".gguf":
            from summrl.backends.embedded.engine import gguf_tokenizer, saved_dequantized

            saved = saved_dequantized(path)
            source, gguf = (str(saved), None) if saved else (str(path), path)
    try:
        tokenizer = gguf_tokenizer(gguf) if gguf else AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        why = " ".join(str(e).split())  # transformers' message spans lines: the error is one
        raise DataError(f"can't load the policy's tokenizer from {source!r} to measure the documents ({why}); with no "
                        f"network, {fix}") from None
    return tokenizer
