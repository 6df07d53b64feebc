"""Experiment tracking: ``logger=none`` logs nothing beyond the run folder, ``logger=wandb`` one W&B run per job.

The W&B run mirrors ART's ``history.jsonl`` line by line (so W&B shows exactly what ART computed,
with ``training_step`` as the x-axis), plus a table of val samples at every eval. ART's own W&B
run stays off (``report_metrics=[]`` and ``backends.art_model.TrainableModel``): one run per job, not two.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from summrl.config import Config
from summrl.errors import Failure
from summrl.job import JobInfo, jsonl_rows
from summrl.secrets import redact, redact_text

TAG_GROUPS = ("reward", "judge", "model", "backend", "algorithm", "sft")
# The W&B run's summary key for the last history row it holds: {"training_step": n, "kinds": ["train", ...]}
HELD = "summrl/history_held"


class Tracker:
    """logger=none: the run folder (history.jsonl, result.json) is the record."""

    def log_history(self) -> None: ...

    def trains(self) -> None:
        """The run is past every check and trains."""

    def log_samples(self, step: int, groups: Sequence[Any]) -> None: ...

    def finish(self, status: str, exit_code: Optional[int] = None) -> None: ...


def flat_config(config: Config, job: JobInfo) -> dict[str, Any]:
    """The resolved config as dotted keys, each group's choice as a top-level key, secrets masked."""
    from dataclasses import asdict

    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and (value or not prefix):  # an empty one is a value: {} (it left no key)
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = value

    walk("", asdict(config))
    if getattr(config.reward, "as_given", None):  # reward=length_penalized: its own keys too
        walk("reward", config.reward.as_given)
    flat.update({group: choice for group, choice in job.choices.items() if choice is not None})
    flat["overrides"] = " ".join(job.overrides)
    return redact(flat)


class WandbTracker(Tracker):
    def __init__(self, config: Config, job: JobInfo, history_path: Path) -> None:
        import wandb

        self.wandb = wandb
        logger = config.logger
        self.config = flat_config(config, job)
        # A folder that holds a run (its history) is resumed: this invocation's config goes to the W&B run once it is
        # past every check (``trains``). Sent at the start, a resume then refused (another reward, a declined cost)
        # overwrote the config of the W&B run it had left as it was.
        self.config_pending = history_path.exists()
        name = redact_text(job.name)
        self.run = wandb.init(
            project=logger.project,
            entity=logger.entity,
            # The run name is unique per job (ART's model name); rerunning it resumes the same W&B run.
            id=wandb_id(config.run.name),
            resume="allow",
            group=job.sweep,
            # A W&B run resumed keeps its name: a resume's overrides (a raised trainer.max_steps) named another run.
            # Named below once W&B says it is new: a fresh machine's folder (its history restored from S3 after the
            # tracker opens) can't tell.
            name=None,
            tags=[f"{g}={job.choices[g]}" for g in TAG_GROUPS if job.choices.get(g)],
            config=None if self.config_pending else self.config,
            dir=config.run.dir,
            mode=wandb_mode(logger),
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        if not getattr(self.run, "resumed", False):
            self.run.name = name
        self.run.define_metric("training_step")
        self.run.define_metric("*", step_metric="training_step")
        self.samples = logger.log_samples
        # A new W&B run (a run tracked from now on; an offline invocation, which writes a folder of its own) gets the
        # whole history; a resumed one the rows past those it holds
        self.mirror = HistoryMirror(history_path, held_rows(self.run.summary)
                                    if getattr(self.run, "resumed", False) else None)

    def trains(self) -> None:
        if self.config_pending:
            self.run.config.update(self.config, allow_val_change=True)  # a resume may change what the checks allow
            self.config_pending = False

    def log_history(self) -> None:
        """Send the rows ART appended to history.jsonl that the W&B run lacks, and say in its summary what it holds."""
        rows = self.mirror.new_rows()
        for record in rows:
            record.pop("recorded_at", None)
            record.pop("step", None)  # ART's copy of training_step; W&B's own step stays monotonic
            # Per-document val scores (val/doc/<id>/*, two panels per val document) stay in history.jsonl and
            # result.json, where summrl.report reads them; W&B has them row by row in the val/samples table.
            self.run.log({k: v for k, v in record.items() if not k.startswith("val/doc/")})
        if rows:
            self.run.summary[HELD] = self.mirror.held

    def log_samples(self, step: int, groups: Sequence[Any]) -> None:
        if not self.samples:
            return
        table = self.wandb.Table(columns=["training_step", "document_id", "summary", "reward", "correct",
                                          "rubric_scores", "hallucinated"])
        for group in groups:
            for t in group.trajectories:
                summary = t.messages_and_choices[-1]
                text = summary.message.content if hasattr(summary, "message") else summary.get("content")
                table.add_data(step, str(t.metadata.get("document_id")), text or "", t.reward,
                               str(t.metadata.get("correct", "")), str(t.metadata.get("rubric_scores", "")),
                               t.metrics.get("hallucination_rate"))
        self.run.log({"val/samples": table, "training_step": step})

    def finish(self, status: str, exit_code: Optional[int] = None) -> None:
        """A stopped run (Ctrl-C, SIGTERM: to be resumed) is marked preempting, as W&B names a run that will come
        back, with the signal's exit code; it was finished as failed, as a crash is. ``exit_code``: the record's, where
        it has one already (a refused resume of a stopped run: the stop's)."""
        if status == "interrupted":
            self.run.mark_preempting()
        if exit_code is None:
            exit_code = 0 if status == "completed" else Failure("interrupted", "").exit_code if (
                status == "interrupted") else 1
        self.run.finish(exit_code=exit_code)


def row_kind(record: dict) -> str:
    """What a history row is, besides its step: the prefixes of its metrics, e.g. "judge+train" or "val"."""
    return "+".join(sorted({key.split("/", 1)[0] for key in record if "/" in key}))


def held_rows(summary: Any) -> dict:
    """What a resumed W&B run holds, from its summary. A run tracked before ``HELD`` existed: every row through its
    last training_step (its kinds unknown)."""
    held = summary.get(HELD)
    if held is not None:
        return {"training_step": held["training_step"], "kinds": list(held["kinds"])}
    step = summary.get("training_step")
    return {} if step is None else {"training_step": step, "kinds": None}


class HistoryMirror:
    """The rows of a growing history.jsonl that a W&B run lacks, given what it holds (``held``: the last row's
    training_step and the kinds of row sent at that step; None: nothing).

    Read from the file's start, so that a W&B run first opened on a resumed run (a run trained with logger=none, every
    offline invocation) has all of it, and a fresh machine's history restored from S3 after the tracker opened is
    still read. Not a count of lines: a restore from an older backup drops rows the W&B run holds. The resumed run's
    own val pass at the step the W&B run ended on (a run stopped during its val pass) is a row of another kind, sent;
    it was dropped as "held" with every row through that step."""

    def __init__(self, path: Path, held: Optional[dict]) -> None:
        held = held or {}
        self.path, self.offset = path, 0
        self.step: float = held.get("training_step", -math.inf)
        kinds = held.get("kinds", ())
        self.kinds: Optional[set[str]] = None if kinds is None else set(kinds)  # None: every kind at that step

    @property
    def held(self) -> dict:
        return {"training_step": self.step, "kinds": sorted(self.kinds or ())}

    def _held(self, step: float, kind: str) -> bool:
        return step < self.step or (step == self.step and (self.kinds is None or kind in self.kinds))

    def new_rows(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]  # complete lines only: a line still being written is read next time
        self.offset += len(whole)
        rows = []
        for record in jsonl_rows(whole.decode(errors="replace")):  # a line a crash cut short is skipped
            if not isinstance(record.get("training_step"), (int, float)):
                rows.append(record)  # (ART writes one on every row)
                continue
            step, kind = record["training_step"], row_kind(record)
            if self._held(step, kind):
                continue
            if step != self.step:
                self.step, self.kinds = step, set()
            self.kinds.add(kind)  # (a set: at a step whose every kind is held, the row was skipped)
            rows.append(record)
        return rows


def wandb_mode(logger) -> str:
    """An explicit logger.mode wins; auto: $WANDB_MODE when set (W&B's own switch), else online when
    WANDB_API_KEY is set, offline otherwise (``wandb sync`` later)."""
    if logger.mode != "auto":
        return logger.mode
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def wandb_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:128]


def open_tracker(config: Config, job: Optional[JobInfo], history_path: Path) -> Tracker:
    if config.logger.kind == "wandb":
        return WandbTracker(config, job or JobInfo(), history_path)
    return Tracker()
