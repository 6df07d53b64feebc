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
from summrl.job import JobInfo, jsonl_rows
from summrl.secrets import redact, redact_text

TAG_GROUPS = ("reward", "judge", "model", "backend", "algorithm", "sft")


class Tracker:
    """logger=none: the run folder (history.jsonl, result.json) is the record."""

    def log_history(self) -> None: ...

    def log_samples(self, step: int, groups: Sequence[Any]) -> None: ...

    def finish(self, failed: bool) -> None: ...


def flat_config(config: Config, job: JobInfo) -> dict[str, Any]:
    """The resolved config as dotted keys, each group's choice as a top-level key, secrets masked."""
    from dataclasses import asdict

    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = value

    walk("", asdict(config))
    walk("reward", getattr(config.reward, "as_given", {}))  # reward=length_penalized: its own keys too
    flat.update({group: choice for group, choice in job.choices.items() if choice is not None})
    flat["overrides"] = " ".join(job.overrides)
    return redact(flat)


class WandbTracker(Tracker):
    def __init__(self, config: Config, job: JobInfo, history_path: Path) -> None:
        import wandb

        self.wandb = wandb
        self.history_path = history_path
        # A resumed run's earlier rows were mirrored by the invocations that wrote them: from the end of the history
        # on this machine, and past the last step the resumed W&B run holds (a fresh machine restores its history
        # from S3 after this). Each resume sent every earlier row again.
        self.offset = whole_lines(history_path)
        self.sent_through: Optional[float] = None
        logger = config.logger
        self.run = wandb.init(
            project=logger.project,
            entity=logger.entity,
            # The run name is unique per job (ART's model name); rerunning it resumes the same W&B run.
            id=wandb_id(config.run.name),
            resume="allow",
            group=job.sweep,
            name=redact_text(job.name),
            tags=[f"{g}={job.choices[g]}" for g in TAG_GROUPS if job.choices.get(g)],
            config=flat_config(config, job),
            dir=config.run.dir,
            mode=wandb_mode(logger),
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.run.define_metric("training_step")
        self.run.define_metric("*", step_metric="training_step")
        self.samples = logger.log_samples
        if getattr(self.run, "resumed", False):
            self.sent_through = self.run.summary.get("training_step")

    def log_history(self) -> None:
        """Send the lines ART appended to history.jsonl since the last call."""
        if not self.history_path.is_file():
            return
        with self.history_path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]  # complete lines only: a line still being written is read next time
        self.offset += len(whole)
        for record in jsonl_rows(whole.decode(errors="replace")):  # a line a crash cut short is skipped
            if self.sent_through is not None and record.get("training_step", math.inf) <= self.sent_through:
                continue  # the resumed W&B run has it
            record.pop("recorded_at", None)
            record.pop("step", None)  # ART's copy of training_step; W&B's own step stays monotonic
            # Per-document val scores (val/doc/<id>/*, two panels per val document) stay in history.jsonl and
            # result.json, where summrl.report reads them; W&B has them row by row in the val/samples table.
            self.run.log({k: v for k, v in record.items() if not k.startswith("val/doc/")})

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

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def whole_lines(path: Path) -> int:
    """The bytes of ``path``'s complete lines (0 when there is none)."""
    if not path.is_file():
        return 0
    data = path.read_bytes()
    return data.rfind(b"\n") + 1


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
