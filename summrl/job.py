"""One Hydra job: what it was asked to run (overrides, group choices, its sweep), and its ``result.json``.

:class:`RunRecord` is the one owner of a run folder's ``result.json``: train.main opens it, the loop updates it
(every save survives a crash), and train.main finishes it when the job fails. Light on purpose (no torch, no ART):
train.py records a job that fails before anything loads, and summrl.report reads the records back.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from summrl.config import JUDGE_KEYS, OPERATIONAL, QARewardConfig
from summrl.errors import ConfigError, stop_signal
from summrl.secrets import redact

RESULT_FILE = "result.json"
# Left out of a job's display name, so that the seeds of one configuration share it (W&B, reports).
NAME_EXCLUDED = ("seed", "run.name", "logger", "hydra", "experiment")


def task_overrides(hydra_cfg: Any) -> list[str]:
    """The job's command-line overrides as typed: ``${oc.env:HF_TOKEN}`` stays that text. Read item by item,
    OmegaConf resolves each, and the variable's value (a key) went into result.json, W&B and the remote command."""
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)]


@dataclass
class JobInfo:
    overrides: list[str] = field(default_factory=list)  # this job's command-line overrides
    choices: dict[str, Optional[str]] = field(default_factory=dict)  # config group -> chosen option
    sweep: Optional[str] = None  # the multirun folder's name, e.g. 2026-11-22_05-10-00; None for a single run
    num: Optional[int] = None  # the job's number within its sweep
    # the keys a basic sweep varies (its jobs differ in them), of every sweep that trained this run: a later sweep in
    # its folder may not change them (check_same_job), though it no longer varies them
    varied: list[str] = field(default_factory=list)

    @classmethod
    def from_hydra(cls) -> "JobInfo":
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra/")}
        if hydra_cfg.mode != RunMode.MULTIRUN:
            return cls(task_overrides(hydra_cfg), choices)
        sweep_dir = Path(hydra_cfg.sweep.dir)
        return cls(task_overrides(hydra_cfg), choices, f"{sweep_dir.parent.name}_{sweep_dir.name}", hydra_cfg.job.num,
                   sorted(sweep_varied(sweep_dir)))

    @property
    def name(self) -> str:
        """The overrides that define the configuration, without seed, run name and logger keys."""
        kept = sorted(o for o in self.overrides if override_key(o).split(".")[0] not in NAME_EXCLUDED
                      and override_key(o) not in NAME_EXCLUDED)
        return ",".join(kept) or "defaults"

    def record(self) -> dict[str, Any]:
        # a secret's value never reaches result.json, whatever carried it
        return {"overrides": redact(self.overrides), "choices": self.choices, "sweep": self.sweep, "job_num": self.num,
                "sweep_varied": self.varied}


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def planned_jobs(folder: Path) -> list[list[str]]:
    """The overrides of each job a sweep folder's ``multirun.yaml`` planned, in job order, expanded as Hydra's basic
    sweeper expands them ([]: no such file, or another sweeper)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    path = folder / "multirun.yaml"
    if not path.is_file():
        return []
    try:
        hydra = OmegaConf.load(path).hydra
        if hydra.sweeper.get("_target_") != BASIC_SWEEPER:
            return []
        params = [f"{k}={v}" for k, v in (hydra.sweeper.get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides([*params, *hydra.overrides.task])
        return [redact(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception as e:  # an edited or foreign file: the jobs on disk are still reported
        print(f"summrl: warning: can't read the planned jobs from {path} ({type(e).__name__}): the jobs "
              "that never started are not listed", file=sys.stderr)
        return []


def sweep_varied(folder: Path) -> set[str]:
    """The keys in which the jobs a sweep folder's ``multirun.yaml`` plans differ (none: one job, or not a basic
    sweep)."""
    plan = [{override_key(o): o for o in job} for job in planned_jobs(folder)]
    return {k for job in plan for k in job if len({j.get(k) for j in plan}) > 1}


def check_same_job(hydra_cfg, earlier: dict) -> None:
    """A sweep resumed in its folder gives job N the run its job N trained: the same job only where the values the
    sweep varies are that run's. Optuna draws its trials anew (job N is another trial), and an edited sweep list moves
    the jobs: either way the job took a run trained with other values (model.lr, which a single run's resume may
    change) and reported its score as its own. The basic sweeper's varied keys are read from multirun.yaml; for a
    sweeper that draws its values, every override must be the run's."""
    if not isinstance(earlier.get("overrides"), list):  # a record from before overrides were kept
        return
    before = {override_key(o): o for o in earlier["overrides"]}
    now = {override_key(o): o for o in redact(list(hydra_cfg.overrides.task))}
    basic = hydra_cfg.sweeper.get("_target_") == BASIC_SWEEPER
    if basic:  # what this sweep varies, and what the sweeps that trained the run varied (an edited list fixes a key)
        varied = sweep_varied(Path(hydra_cfg.sweep.dir)) | set(earlier.get("sweep_varied") or [])
    else:
        varied = set(now) | set(before)
    changed = [k for k in sorted(varied) if now.get(k) != before.get(k)]
    if changed:
        said = ", ".join(f"{before.get(k) or f'{k} unset'} (now {now.get(k) or 'unset'})" for k in changed[:4])
        sweeper = hydra_cfg.sweeper.get("_target_", "this sweeper").rsplit(".", 1)[-1]
        why = ("the sweep's values changed, so its jobs moved" if basic else
               f"{sweeper} draws its values anew, so a job number names another trial")
        raise ConfigError(f"job {hydra_cfg.job.num} of this sweep resumes the run in {hydra_cfg.runtime.output_dir}, "
                          f"trained with {said}: {why}. Start the sweep in a new folder (hydra.sweep.dir=...), or "
                          "resume that run with its own values")


def peak_rss_gb() -> float:
    """This process's peak resident size in GB: what a run needs of the machine's memory.

    Linux's VmHWM (the high-water mark of this program's own memory) where there is one. getrusage's ru_maxrss is
    not that: it carries the parent's resident size across fork and exec, so a run started from a 3.5 GB test process
    reported 3.5 GB where it peaked at 1.0 GB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) * 1024 / 1e9, 2)
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KB elsewhere
    return round(peak / (1e9 if sys.platform == "darwin" else 1e6), 2)


def write_json(path: Path, record: dict) -> None:
    """Write a JSON record atomically: a reader never sees half a record."""
    write_atomic(path, (json.dumps(record, indent=2) + "\n").encode())


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file whole or not at all: a temporary file, flushed to disk, then renamed over ``path`` (a crash or a
    power cut leaves the old file or the new one, never a cut or empty one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def jsonl_rows(text: str) -> list[dict]:
    """The rows of a JSONL text; a line a crash cut short (or a blank one) is skipped."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def append_jsonl(path: Path, rows: Sequence[dict]) -> None:
    """Append rows to a JSONL file, each on its own line, flushed to disk. A line a crash cut short stays a line of
    its own (a fresh line starts after it), which readers skip; the rows after it are kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another process appending (two servers recording one run): one at a time
        if f.tell():  # "ab" starts at the end: look at the last byte only
            with path.open("rb") as last:
                last.seek(-1, os.SEEK_END)
                if last.read(1) != b"\n":  # the last write was cut off by a crash: start a fresh line
                    f.write(b"\n")
        f.write("".join(json.dumps(row) + "\n" for row in rows).encode())
        f.flush()
        os.fsync(f.fileno())


def write_result(run_dir: str | Path, result: dict) -> None:
    write_json(Path(run_dir) / RESULT_FILE, result)


def read_result(run_dir: str | Path) -> Optional[dict]:
    """The run's result.json, or None: none yet, one a crash left unreadable (written before write_atomic), or JSON
    that is no record (a list: summrl.sweep status ended in a traceback on one)."""
    path = Path(run_dir) / RESULT_FILE
    try:
        record = json.loads(path.read_text()) if path.is_file() else None
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def comparable(history: list[dict]) -> list[dict]:
    """The val scores measured as the latest was: on the same val documents with the same reward. An online run
    (dataset=inbox) scores its own val documents, often with another reward (``val_set``), so its scores and the
    original run's don't compare."""
    if not history:
        return []
    key = history[-1].get("val_set")
    return [h for h in history if h.get("val_set") == key]


# What a val score is a function of besides the policy and the val documents: the judge that grades it, for
# qa_accuracy the QA rules val QA applies, and for the val reward the reward's own settings and the trainer settings
# it reads. Jobs that differ here are not on one scale; an operational setting (reward.cache_dir) changes no score.
VAL_QA_KEYS = ("trainer.val_qa_max_chars", "trainer.val_qa_forbid_han")
REWARD_KIND = re.compile(r"reward\.(?:terms\.[^.]+\.reward\.)?kind")


def val_qa_settings(config: dict) -> dict[str, str]:
    """The QA rules val/qa_accuracy was measured with (summrl.rewards.build_val_reward): trainer.val_qa_*, which
    validation sets to a single QA term's; a result from before they existed used that term's, else QARewardConfig's."""
    if all(k in config for k in VAL_QA_KEYS):
        return {k: str(config[k]) for k in VAL_QA_KEYS}
    terms = [k[:-len("kind")] for k, v in config.items() if v == "qa" and REWARD_KIND.fullmatch(k)]
    read = {}
    for key in VAL_QA_KEYS:
        setting = key[len("trainer.val_qa_"):]  # max_chars, forbid_han
        default = getattr(QARewardConfig, setting)
        read[key] = str(config.get(terms[0] + setting, default) if len(terms) == 1 else default)
    return read


def flat_reward_kinds(config: dict) -> set[str]:
    """The kinds of a flat config's reward and of its terms."""
    return {v for k, v in config.items() if REWARD_KIND.fullmatch(k)}


def val_reward_reads(config: dict) -> set[str]:
    """The trainer settings the val reward reads: the length term trainer.max_words, RULER the summarizer's chat that
    its judge is shown (trainer.prompt, which may state max_words)."""
    kinds = flat_reward_kinds(config)
    return ({"trainer.max_words"} if kinds & {"length", "ruler"} else set()) | (
        {"trainer.prompt"} if "ruler" in kinds else set())


def val_sampling(config: dict) -> dict[str, str]:
    """The temperature the val summaries were drawn at (trainer.val_temperature; null: trainer.temperature), from a
    flat config: every val metric is of those draws, so a sweep over trainer.temperature compares other decodings
    too (its arms were paired and given verdicts as though only training differed)."""
    value = config.get("trainer.val_temperature")
    value = config.get("trainer.temperature") if value is None else value
    return {} if value is None else {"trainer.val_temperature": str(float(value))}


# The settings a written question set depends on besides its writer (the judge) and the documents
# (dataset.questions, for documents without questions of their own): another count, share of unanswerable questions
# or check writes other questions, so QA scores against them are on another scale.
QUESTION_KEYS = tuple(f"dataset.questions.{k}" for k in ("per_document", "unanswerable_share", "check"))


def scale_settings(config: dict, metric: str) -> dict[str, str]:
    """What ``metric`` (qa_accuracy, or the val reward) was measured with, from a flat config (result.json's, as
    summrl.tracking.flat_config writes it): dotted key -> value. Scores that differ here are not on one scale."""
    keys = {f"judge.{k}" for k in JUDGE_KEYS}
    if metric == "qa_accuracy":
        keys |= set(QUESTION_KEYS)
    if metric == "reward":
        keys |= {k for k in config if k.startswith("reward.") and not k.endswith(OPERATIONAL)}
        keys |= val_reward_reads(config)
        if "qa" in flat_reward_kinds(config):
            keys |= set(QUESTION_KEYS)
    settings = {k: str(config[k]) for k in sorted(keys) if k in config}
    return {**settings, **(val_qa_settings(config) if metric == "qa_accuracy" else {}), **val_sampling(config)}


# What the run's checkpoints were trained with (summrl.loop sets them as it starts): an invocation that trains no step
# (an inbox run with nothing new, or one failing before its first step) keeps its earlier invocations'. Another
# reward's best_by changed which checkpoint step=best serves, exports and benchmarks.
TRAINED_WITH = ("best_by", "config", "algorithm", "seed", "choices", "overrides")
# What save() writes itself, or what one invocation's failure says: not carried from an earlier invocation's record
PER_INVOCATION = ("traceback", "error", "error_kind", "exit_code", "val_history", "attempts", "untrained_steps",
                  "wall_s")


class RunRecord:
    """A run folder's ``result.json`` across the invocations of one run (a rerun with the same run.name resumes).

    ``earlier`` is what earlier invocations recorded: read from the folder when the record opens, or, on a fresh
    machine, restored from the S3 backup (:meth:`adopt`). It keeps their val history and wall time. The loop sets
    this invocation's fields with :meth:`update` and writes them with :meth:`save`; a job that fails is finished by
    :meth:`fail`, which never lets a config typo overwrite an earlier invocation's record."""

    def __init__(self, run_dir: str | Path, job: Optional[JobInfo] = None) -> None:
        self.run_dir = Path(run_dir)
        self.job = job or JobInfo()
        self.earlier: dict = read_result(self.run_dir) or {}
        self._keep_varied()
        self.fields: dict[str, Any] = {}
        self.val_history: list[dict] = list(self.earlier.get("val_history", []))
        self.attempts: list[dict] = list(self.earlier.get("attempts", []))  # one per invocation that trained
        self.untrained_steps: list[int] = list(self.earlier.get("untrained_steps", []))  # no group trainable
        self.started = time.time()
        self.saved = False  # this invocation has written the record
        self.timed = True  # this invocation's time counts in the run's wall_s (not when it trained nothing)
        self.stepped = False  # this invocation has trained a step: TRAINED_WITH are then its own
        self.resume_with: list[str] = []  # what the same command needs added to resume (train.resume_overrides)
        self.stopped_waiting = False  # dataset=inbox: a signal came while it waited for documents, before training
        self.was_refused = False  # a resume refused before it trained (``refused``): the record is the earlier one

    def _keep_varied(self) -> None:
        self.job.varied = sorted({*self.job.varied, *(self.earlier.get("sweep_varied") or [])})

    def adopt(self, earlier: Optional[dict]) -> None:
        """A fresh machine: what the run's earlier invocations backed up (their result.json, restored from S3)."""
        if earlier and not self.earlier:
            self.earlier = earlier
            self._keep_varied()
            self.val_history = list(earlier.get("val_history", []))
            self.attempts = list(earlier.get("attempts", []))
            self.untrained_steps = list(earlier.get("untrained_steps", []))

    def begin_attempt(self, step: int, managed_job_id: Optional[str]) -> None:
        """This invocation trains from ``step`` (0, or the checkpoint it resumed). A managed job's recovery is a new
        attempt of the same job id. The previous attempt trained at least to ``step``: its checkpoint is the one
        restored, though the attempt may have been killed before its record said so."""
        if self.attempts and self.attempts[-1]["end_step"] < step:
            self.attempts[-1].update(end_step=step, steps_trained=step - self.attempts[-1]["start_step"])
        self.attempts.append({"attempt": len(self.attempts) + 1, "managed_job_id": managed_job_id,
                              "started_at": time.time(), "start_step": step, "end_step": step, "steps_trained": 0})
        if managed_job_id is not None:
            same = [a for a in self.attempts if a["managed_job_id"] == managed_job_id]
            self.update(managed_job_id=managed_job_id, recoveries=len(same) - 1)

    def idle(self) -> None:
        """This invocation found the run finished and trained or scored nothing: its time and its attempt are not the
        run's (each rerun of a sweep's finished job added an attempt of 0 steps and its load time to wall_s)."""
        self.timed = False
        if self.attempts and self.attempts[-1]["steps_trained"] == 0:
            self.attempts.pop()

    def trained(self, step: int) -> None:
        """This attempt has trained up to ``step``."""
        self.stepped = True
        if self.attempts:
            self.attempts[-1].update(end_step=step, steps_trained=step - self.attempts[-1]["start_step"])

    def earlier_trained(self) -> bool:
        """Whether an earlier invocation trained a step: then TRAINED_WITH are its. One that trained nothing (a typo's
        config error) set nothing the checkpoints were trained with: keeping its settings refused the right resume."""
        return bool(self.earlier.get("steps")) or any(
            a.get("end_step", 0) > a.get("start_step", 0) for a in self.earlier.get("attempts", []))

    def untrained(self, step: int) -> None:
        """Step ``step`` trained no group: every group's rewards were equal, so GRPO had no advantage."""
        self.untrained_steps.append(step)

    def resume_at(self, step: int) -> None:
        """The run resumes at ``step``: the earlier val scores up to it are kept, later ones are scored again (and
        later steps trained again)."""
        self.val_history = [h for h in self.earlier.get("val_history", []) if h["step"] <= step]
        self.untrained_steps = [s for s in self.earlier.get("untrained_steps", []) if s <= step]

    def update(self, **fields: Any) -> None:
        self.fields.update(fields)

    def carried(self) -> dict[str, Any]:
        """What the run's earlier invocations recorded that this one keeps (not its own timings and status)."""
        return {k: v for k, v in self.earlier.items() if k not in PER_INVOCATION}

    def nothing_to_train(self, **fields: Any) -> None:
        """This invocation ends without training (dataset=inbox with too few new documents): the record keeps what
        earlier invocations recorded (steps, val scores, rollouts), with ``fields``, and its time is not the run's."""
        self.fields = {**self.carried(), **self.fields, **fields}
        self.timed = False

    def save(self, *, timed: bool = True) -> None:
        """Write the record (atomically): this invocation's fields over what earlier invocations recorded (a resumed
        invocation stopped before its session existed wrote its own fields alone: the run's judge calls and $, its
        rollouts and val figures were gone, and the next resume counted from 0), the val history, the run's total
        wall time (this invocation's time not counted when ``timed`` is false: it trained nothing)."""
        timed = timed and self.timed
        wall_s = round(self.earlier.get("wall_s", 0.0) + (time.time() - self.started if timed else 0.0), 1)
        attempts = {"attempts": self.attempts} if self.attempts else {}
        kept = ({k: self.earlier[k] for k in TRAINED_WITH if k in self.earlier}
                if not self.stepped and self.earlier_trained() else {})
        write_result(self.run_dir, {**self.carried(), **self.fields, **kept, "val_history": self.val_history,
                                    **attempts, "untrained_steps": self.untrained_steps, "wall_s": wall_s})
        self.saved = True

    def leaves_as_it_was(self, error: BaseException) -> bool:
        """Whether this invocation, stopped by ``error`` before it trained a step, leaves the run's status as its
        earlier invocations left it: a completed run's results stand whatever stopped a rerun (a config error, Ctrl-C
        while it loaded, a network error: each made it "failed" or "interrupted", and summrl.report left it out), and a
        stopped run refused a resume by a config error is still a stopped run to resume."""
        status = self.earlier.get("status")
        return not self.stepped and (status == "completed" or (status == "interrupted"
                                                              and isinstance(error, ConfigError)))

    def refused(self) -> None:
        """This invocation stopped before it trained, and the run stays as its earlier invocations left it
        (``leaves_as_it_was``), its status and error included; what this invocation spent stays counted, its time is
        not the run's."""
        for key in ("status", "error", "error_kind", "exit_code", "traceback"):
            if key in self.earlier:
                self.fields[key] = self.earlier[key]
            else:
                self.fields.pop(key, None)
        self.timed = False
        self.was_refused = True

    def stop_waiting(self) -> None:
        """An online run stopped while it waited for inbox documents: it trained nothing, and the run is as its last
        invocation left it (it said "interrupted", and to resume)."""
        self.nothing_to_train(status=self.earlier.get("status", "interrupted"))
        self.stopped_waiting = True

    def interruption(self) -> str:
        """What a run stopped by Ctrl-C says: the last step whose checkpoint it wrote, and how to go on."""
        step = self.attempts[-1]["end_step"] if self.attempts else 0
        command = f"the same command with {shlex.join(self.resume_with)}" if self.resume_with else "the same command"
        if self.stopped_waiting:
            return (f"stopped while waiting for inbox documents ({stop_signal()}): nothing was trained, and result.json "
                    f"is as the run's last invocation left it; run {command} to wait again")
        if self.was_refused:
            return (f"stopped before it trained ({stop_signal()}): nothing was trained, and result.json is as the "
                    f"run's last invocation left it ({self.earlier.get('status')}, step {step}); run {command} to go on")
        if step:
            return f"stopped after step {step} ({stop_signal()}); its checkpoint is kept: run {command} to resume from it"
        return f"stopped before the first checkpoint ({stop_signal()}); run {command} to start again"

    def fail(self, kind: str, line: str, exit_code: int) -> None:
        """Record why the job failed. A record this invocation wrote gains the failure's kind. One that failed
        before writing (a config error, a W&B key refused at the start) gets a complete record that keeps what
        earlier invocations recorded (val_history, wall_s), unless it never started training and the folder holds
        an earlier invocation's record, which a config typo must not overwrite."""
        if self.was_refused:
            return
        timed = self.saved
        if not self.saved:
            if self.earlier and "status" not in self.fields:
                return
            self.fields = {**self.carried(),
                           **self.fields, "status": "interrupted" if kind == "interrupted" else "failed",
                           "error": line, **self.job.record()}
        self.update(error_kind=kind, exit_code=exit_code)
        self.save(timed=timed)
