"""The policy's tokenizer, to measure documents in the policy's own tokens (``dataset.max_document_tokens``) before
any model loads.

From ``model.weights`` when set (a folder, a .gguf file or a ``pkg:`` path), else the hub id from the local Hugging
Face cache. Reading a tokenizer out of a GGUF file takes transformers about 8 s on 2 cores, so the tokenizer is
saved once, keyed by the file's content and the transformers version, and read back in well under a second.
``$SUMMRL_CACHE_DIR`` moves the cache (default ``~/.cache/summrl``), as for the de-quantized weights.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from summrl.data.document import resolve_path
from summrl.data.split import DataError


def cache_root() -> Path:
    return Path(os.environ.get("SUMMRL_CACHE_DIR") or Path.home() / ".cache" / "summrl")


def load_tokenizer(model: Any) -> Any:
    """The tokenizer of ``model`` (a ModelConfig). Raises DataError naming the fix when it can't be had."""
    import transformers
    from transformers import AutoTokenizer

    source, kwargs, saved = model.base_model, {}, None
    if model.weights:
        path = resolve_path(model.weights)
        if not path.exists():
            raise DataError(f"model.weights={model.weights}: {path} does not exist")
        source = str(path)
        if path.suffix == ".gguf":
            with path.open("rb") as f:
                content = hashlib.file_digest(f, "sha256").hexdigest()
            saved = cache_root() / "tokenizers" / f"{path.stem}-{content[:16]}-{transformers.__version__}"
            if (saved / "tokenizer_config.json").exists():
                return AutoTokenizer.from_pretrained(str(saved))
            source, kwargs = str(path.parent), {"gguf_file": path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as e:
        raise DataError(f"can't load the policy's tokenizer from {source!r} to measure the documents ({e}); with no "
                        "network, set model.weights to a local folder or .gguf file, or turn the limit off with "
                        "dataset.max_document_tokens=null") from None
    if saved is not None:
        _save(tokenizer, saved)
    return tokenizer


def _save(tokenizer: Any, target: Path) -> None:
    """Written beside its place, then renamed in: a concurrent job sees all of it or none."""
    partial = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        tokenizer.save_pretrained(partial)
        os.replace(partial, target)
    except OSError:  # another job saved it first, or no room: the next load reads the GGUF again
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
