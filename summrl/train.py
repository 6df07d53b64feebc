"""`python -m summrl.train [overrides]`: compose, validate, run one training job.

Heavy libraries (torch, ART, litellm) are imported only after the config is validated, so a bad
value fails in about a second. Returns the final validation score for Hydra sweepers.

An expected failure (summrl.errors) ends the run with one line and its exit code; tracebacks only
with HYDRA_FULL_ERROR=1. Every failed job, even one that never started, records why in its ``result.json``.
In a multirun a failing job raises an ordinary exception: Hydra runs the sweep's other jobs, then exits non-zero.
Ctrl-C ends it with one line and exit code 130 (SIGTERM the same way, 143), its checkpoints kept and its record
saying ``interrupted``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from summrl import cli
from summrl.cloud.launch import run_from_hydra
from summrl.config import Config, validate
from summrl.errors import (KINDS, ConfigError, Failure, classify, end, exit_on, full_errors, run_async,
                           stop_signal)
from summrl.job import JobInfo, RunRecord, check_same_job, read_result
from summrl.preflight import check

log = logging.getLogger("summrl.train")  # not __name__: run as __main__, it would miss the summrl logger


def load_config(cfg: DictConfig) -> Config:
    """Validate the composed config and load .env; in a multirun, name each job apart.
    What the run needs from the machine and the environment (keys, GPU, bucket) is the preflight's."""
    hydra_cfg = HydraConfig.get()
    config = validate(cfg)
    # serve, export, benchmark and resume read a run as one folder: its .hydra/ config (which Hydra writes into its
    # output folder before the job starts), log, result.json and checkpoints
    if config.run.dir is None or Path(config.run.dir).resolve() != Path(hydra_cfg.runtime.output_dir).resolve():
        raise ConfigError(f"run.dir={config.run.dir or 'null'}: the run folder is Hydra's output folder; set "
                          f"hydra.run.dir={config.run.dir or '<folder>'} instead (run.dir follows it; hydra.sweep.dir "
                          "for a multirun)")
    # sft's options differ only in their kind: a kind set past the option (sft.kind=best_of_n) ran that stage, while
    # the W&B tags and the group's key in the config said sft=none
    chosen = hydra_cfg.runtime.choices.get("sft")
    if chosen is not None and chosen != config.sft.kind:
        raise ConfigError(f"sft.kind: is fixed by the option (sft=...): got {config.sft.kind!r} with sft={chosen}; "
                          f"choose it with sft={config.sft.kind}")
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # Unnamed, a sweep's jobs are named for its folder: ${now} is read as each job starts, so each job had its own
        # time, and no one run.name resumed them all.
        base = config.run.name if _named(cfg) else JobInfo.from_hydra().sweep
        config.run.name = f"{base}-{hydra_cfg.job.num}"
    check_folder_holds_this_run(config, hydra_cfg)
    return config


def _named(cfg: DictConfig) -> bool:
    """run.name was set (on the command line or in a config file such as an experiment preset), not left to
    conf/train.yaml's ``${now:...}``: a preset's name was replaced by the sweep folder's in a multirun."""
    raw = OmegaConf.to_container(cfg.run, resolve=False).get("name")
    return not (isinstance(raw, str) and raw.startswith("${now:"))


def _given(hydra_cfg) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in [*hydra_cfg.overrides.task, *hydra_cfg.overrides.hydra]}


def resume_overrides(config: Config, hydra_cfg) -> list[str]:
    """What the same command needs added to resume this run, where the command left it to default to the time it
    was started: a single run's name, or a sweep's folder (its jobs are named for it)."""
    given = _given(hydra_cfg)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return [] if "hydra.sweep.dir" in given else [f"hydra.sweep.dir={hydra_cfg.sweep.dir}"]
    return [] if "run.name" in given else [f"run.name={config.run.name}"]


def check_folder_holds_this_run(config: Config, hydra_cfg) -> None:
    """A run folder is one run's: another run started in it (a rerun that named the folder and not the run) trained
    from step 0 beside the first one's checkpoints, and its result.json summed both runs' attempts and time. A record
    of a run that trained nothing (it failed on its config or data) holds nothing to keep apart."""
    earlier = read_result(config.run.dir) or {}
    other = earlier.get("run_name")
    if other is None or not (earlier.get("attempts") or earlier.get("val_history")):
        return
    if other == config.run.name:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            check_same_job(hydra_cfg, earlier)
        return
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    name = other.removesuffix(f"-{hydra_cfg.job.num}") if multirun else other
    where = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    raise ConfigError(f"run.name={config.run.name}: the run folder {config.run.dir} holds run {other} (its "
                      f"result.json); to resume that run, add run.name={name}, or give this one its own folder "
                      f"({where}=...)")


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    job = JobInfo.from_hydra()
    record = RunRecord(HydraConfig.get().runtime.output_dir, job)  # result.json: its one owner
    try:
        config = load_config(cfg)
        record.resume_with = resume_overrides(config, HydraConfig.get())
        if config.backend.kind == "skypilot":  # this same job on a cloud GPU, with backend=local_gpu there

            return run_from_hydra(config, record)
        check(config)  # the backend's packages, GPU and keys, and the backup bucket: all listed, before loading
        # ART's gather draws a progress bar per batch; the loop prints one line per step instead.
        os.environ.setdefault("TQDM_DISABLE", "1")
        from summrl.loop import train  # heavy (torch, ART, litellm): loaded only once the config is known to be good

        return run_async(train(config, record))
    except KeyboardInterrupt:  # Ctrl-C: the loop has saved its record and closed the backend; a sweep stops too
        if record.stopped_waiting or record.was_refused:  # nothing trained, the record as it was
            end(Failure("interrupted", record.interruption()))
        if record.fields.get("status") == "completed":  # a signal while the finished run closed its backend
            log.warning(f"summrl: {stop_signal()} while closing the backend: the run had completed, and its record "
                        "says so")
            return record.fields.get("final_val_score")
        failure = Failure("interrupted", record.interruption())
        record.fail(failure.kind, failure.line, failure.exit_code)
        end(failure)
    except Exception as e:
        failure = classify(e)
        if failure is None:
            raise  # a bug: Hydra prints the traceback
        record.fail(failure.kind, f"{KINDS[failure.kind][1]}: {failure.message}", failure.exit_code)
        if job.sweep is None or full_errors():
            exit_on(e)  # its one line and exit code (its traceback with HYDRA_FULL_ERROR=1)
        # SystemExit would end the whole sweep; an exception fails this job only. Hydra prints a compact one
        # as its message alone when the sweep ends, not as a traceback.
        log.error(failure.line)
        raise JobFailed(failure.line) from e


class JobFailed(CompactHydraException):
    """A sweep's job that ended with an expected failure (its one line)."""


if __name__ == "__main__":
    cli.run(main)
