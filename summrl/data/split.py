"""The seeded val/train split every dataset shares (Summary-RL's): shuffle the documents with ``dataset.seed``; val
is the first ``val_size`` of them, train the next ``train_size``. A size is a count, a fraction of the documents or
``all`` (what the other split leaves), as :func:`summrl.config.split_size` reads it."""

from __future__ import annotations

import random
from typing import Any, Sequence, TypeVar, Union

from summrl.errors import ExpectedFailure, is_network

T = TypeVar("T")


class DataError(ExpectedFailure, ValueError):
    """A dataset file or row that cannot be used; the message names the file and the row. Sizes the data can't
    meet or a bad row are config errors; the hub out of reach is a network error."""

    @property
    def failure(self) -> str:  # type: ignore[override]
        return "network" if is_network(self) else "config"


def split_counts(n: int, train_size: Union[int, float, str], val_size: Union[int, float, str],
                 source: str, env_sizes: bool = False) -> tuple[int, int]:
    """(val, train) document counts for ``n`` documents. Raises DataError when the data can't meet them (naming the
    TRAIN_SIZE / VAL_SIZE variables where ``env_sizes``: the sizes' defaults come from them)."""

    def count(size: Union[int, float, str], key: str) -> int:
        if isinstance(size, float):
            return max(1, round(size * n))
        return int(size) if size != "all" else -1

    val, train = count(val_size, "val_size"), count(train_size, "train_size")
    if isinstance(val_size, float) and isinstance(train_size, float):  # each rounded alone, 0.9 + 0.1 could pass n
        train = min(train, n - val)
    if val < 0:
        val = n - train
    if train < 0:
        train = n - val
    if val <= 0 or train <= 0 or val + train > n:
        given, counted = f"{train_size} + {val_size}", f"{max(train, 0)} + {max(val, 0)}"
        sizes = f"train_size + val_size = {given}{'' if counted == given else f' = {counted}'} documents"
        variables = " (or the TRAIN_SIZE / VAL_SIZE environment variables)" if env_sizes else ""
        if max(val, 0) + max(train, 0) <= n:  # within the documents, but one side gets none ("0 + 1 ... only 1")
            side = "train" if train <= 0 else "val"
            raise DataError(f"{source}: {sizes} leaves {side} no document of the {n} available; each split needs at "
                            f"least one: add documents, or change dataset.train_size / dataset.val_size{variables}")
        raise DataError(  # the counts are shown where they differ from the sizes given (a fraction, "all")
            f"{source}: {sizes}, but only {n} documents are available. Lower dataset.train_size / dataset.val_size"
            f"{variables}; each split needs at least one document.")
    return val, train


def split(documents: Sequence[T], dataset: Any, source: str) -> tuple[list[T], list[T]]:
    """(val, train): a seeded shuffle of ``documents``, val first. Growing train keeps val fixed."""
    # dataset=repliqa's sizes default to $TRAIN_SIZE / $VAL_SIZE (conf/dataset/repliqa.yaml); no other dataset's do
    val_n, train_n = split_counts(len(documents), dataset.train_size, dataset.val_size, source,
                                  env_sizes=getattr(dataset, "name", None) == "repliqa")
    shuffled = list(documents)
    random.Random(dataset.seed).shuffle(shuffled)
    return shuffled[:val_n], shuffled[val_n: val_n + train_n]
