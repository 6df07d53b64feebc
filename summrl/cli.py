"""Run a ``@hydra.main`` entry point (train, benchmark, serve, export) so that a config Hydra can't compose ends like
every other config error: one line naming the key's full path, with a hint (summrl.config.config_error), and exit
code 2.

Hydra prints a composition error itself and exits 1. With ``HYDRA_FULL_ERROR=1`` it raises instead, so the entry
point sets that for Hydra and keeps the user's own choice in ``SUMMRL_FULL_ERROR``: summrl.errors shows
tracebacks only when the user asked for them. ``OutputFolder`` does the same for an output folder Hydra can't make.
The process then ends as Python's exit would, less the teardown of the loaded modules (``_exit``).
SIGTERM is handled as Ctrl-C is (``_terminate``), so a killed run saves its record and closes its backend.
"""

from __future__ import annotations

import atexit
import copy
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, NoReturn

from hydra.errors import CompactHydraException, ConfigCompositionException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from summrl.config import config_error, refuse_secrets
from summrl.errors import ConfigError, Failure, full_errors, stop_signal, stopped_by
from summrl.keys import load_env_file
from summrl.secrets import name_secret_variables, redact_text


def run(main: Callable[[], object]) -> NoReturn:
    os.environ.setdefault("SUMMRL_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", ""))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises what it would print; the user's choice is kept above
    take_signals()
    if any(prints_config(arg) for arg in sys.argv[1:]):
        sys.stdout = _Redacted(sys.stdout)
    load_env_file()  # before Hydra composes: ${oc.env:X} may read an X that only .env sets
    name_secret_variables(env_settings(sys.argv[1:]))  # Hydra's own errors come before the config names them
    try:
        try:
            main()
        except (ConfigCompositionException, OmegaConfBaseException) as e:
            if full_errors():
                raise
            _config_failure(config_error(e))
        except OverrideParseException as e:  # a usage error (exit 2), not a bug (exit 1)
            if full_errors():
                raise
            _config_failure(override_error(e))
        except CompactHydraException as e:  # a sweep's failed jobs (train.JobFailed), Hydra's own usage errors
            if full_errors():
                raise
            print(redact_text(str(e)), file=sys.stderr, flush=True)
            sys.exit(1)
        except KeyboardInterrupt:  # an entry point with no interrupted path of its own (export, serve's start)
            failure = Failure("interrupted", f"stopped ({stop_signal()})")
            print(failure.line, file=sys.stderr, flush=True)
            sys.exit(failure.exit_code)
    except SystemExit as e:
        _exit(e.code)
    _exit(0)


def override_error(e: OverrideParseException) -> ConfigError:
    """Hydra's grammar error as one line naming the argument; an argument with no "=" (a run folder, typed as
    summrl.report and summrl.sweep take one) also says how overrides are written."""
    detail = "; ".join(line for line in e.message.splitlines()
                       if not line.startswith(("Error parsing override", "See https://")))
    hint = ("" if "=" in e.override else ": each argument is key=value (trainer.max_steps=5; a run folder is "
            "run_dir=<folder> for serve and export, benchmark.run_dir=<folder> for the benchmark)")
    return ConfigError(f"can't read the override {e.override!r}{hint} (Hydra: {detail})")


# Hydra's flags that print the config (``--cfg job --resolve`` with its interpolations resolved, ``${oc.env:...}``
# among them) or help made from it, before summrl sees the config
PRINTS_CONFIG = {"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i"}


def prints_config(arg: str) -> bool:
    """``arg`` is one of PRINTS_CONFIG as argparse reads it: ``--cfg job``, ``--cfg=job``, a short flag with its value
    attached (``-cjob``) or a long one cut to any unambiguous prefix (``--cf job``, ``--inf``). Those two printed
    the keys unmasked. (``-cp``/``-cn``, Hydra's config path and name, match too: their output is masked, harmless.)"""
    flag = arg.split("=", 1)[0]
    if flag.startswith("--"):
        return len(flag) > 2 and any(name.startswith(flag) for name in PRINTS_CONFIG if name.startswith("--"))
    return flag[:2] in PRINTS_CONFIG


class _Redacted:
    """stdout with the secrets masked (summrl.secrets): what Hydra prints for those flags goes through ``print``."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(redact_text(text))

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding: the stream's own
        return getattr(self.stream, name)


def env_settings(args: list[str]) -> list[str]:
    """The variables the command line's ``*_env`` settings name (``judge.api_key_env=MYJUDGE``, a benchmark entry's
    ``{..., api_key_env: MYJUDGE}``, a sweep's ``A,B``): their values are keys, whatever the names, and a key typed as
    another setting's value was printed in Hydra's error, which comes before the typed config names them."""
    names = []
    for arg in args:
        for found in re.finditer(r"_env\s*[=:]\s*([^}\]]*)", arg):
            names += re.findall(r"[A-Za-z_][A-Za-z0-9_]*", found.group(1))
    return names


def take_signals() -> None:
    """Every command's handling of the signals that stop it: SIGTERM takes Ctrl-C's path (:func:`_terminate`)."""
    signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background by a script (`cmd &`), which ignores Ctrl-C for it: SIGTERM takes Ctrl-C's path,
        # so that needs Python's handler (and asyncio's, which it installs only over Python's). Otherwise a SIGTERM
        # during an update was ignored, and at other times raised wherever the main thread was (a __del__ drops it).
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (`kill`, a scheduler, SkyPilot cancelling a job) takes Ctrl-C's path: whatever handles SIGINT now
    (asyncio's runner cancels the run's task; otherwise KeyboardInterrupt), so the record says interrupted and the
    backend is closed, where Python's default ended the process at once with result.json still saying running."""
    stopped_by(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def _already_stopping(signum: int, frame: Any) -> None:
    """A signal while the process ends. KeyboardInterrupt there broke off the joining of threads (a wall of
    tracebacks, then an abort: 'terminate called without an active exception') or an atexit handler (a log file
    not flushed). Said once, with os.write: print could re-enter the stream it interrupted."""
    global _told_stopping
    if not _told_stopping:
        _told_stopping = True
        os.write(2, b"summrl: already stopping: closing threads and files (kill -9 ends it now, unsaved)\n")


_told_stopping = False


def _exit(code: object) -> NoReturn:
    """End the process as the interpreter would, without its teardown of every module.

    As Python's own exit does: the non-daemon threads are joined (thread pools told to stop first), then the atexit
    handlers run (logging's files, W&B, multiprocessing's children, temporary folders), then the streams are flushed.
    What is skipped is tearing down the modules that torch, transformers, litellm and ART loaded: about 2 s at the end
    of every command on 2 cores (1.9 s after `import art` alone), and nothing is written in it. An uncaught exception
    does not come here: it ends the usual way, with its traceback."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"), as Python prints it
        print(code, file=sys.stderr)
        status = 1
    for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C while threads are joined: said, not a traceback
        signal.signal(signum, _already_stopping)
    shutdown_threads = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx calls first
    if shutdown_threads is not None:
        shutdown_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more reaches it anyway
            pass
    os._exit(status)


class OutputFolder(Callback):
    """Hydra makes the output folder (hydra.run.dir, or hydra.sweep.dir for a multirun) before the job starts, and
    where a file stands in the way it ends in mkdir's traceback. Checked first (``hydra.callbacks`` in the entry
    points' configs that write one), it is a config error like any other: its one line and exit code 2. (Hydra turns
    a callback's exception into a warning and goes on, so the callback exits itself.) A secret in the config is
    refused here too, before Hydra saves the config into that folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_folder(config, "hydra.run.dir")
        _refuse_secrets(config)
        _refuse_second_inbox_run(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_folder(config, "hydra.sweep.dir")
        _refuse_secrets(config)


def _refuse_second_inbox_run(config: DictConfig) -> None:
    """A dataset=inbox run of a run another process trains on its inbox, refused before Hydra saves this one's config
    over the training run's (.hydra/, which serve, export and benchmark read). The loop takes the lock itself."""
    if OmegaConf.select(config, "dataset.kind", default=None) != "inbox":
        return
    try:
        run_dir = OmegaConf.select(config, "hydra.run.dir", throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return
    from summrl import inbox

    if not (Path(str(run_dir)) / inbox.TRAIN_LOCK).exists():
        return
    try:
        inbox.hold_training(run_dir).close()  # free: released at once, and the loop takes it
    except ConfigError as e:
        _config_failure(e)


def _refuse_secrets(config: DictConfig) -> None:
    """A secret in the config, refused before Hydra saves the config into the run folder (config.refuse_secrets).
    Checked on a copy: resolving ${now:...} caches its value in the config, and a multirun's jobs are copies of
    this one, so each job's default run.name would be this moment's rather than its own."""
    try:
        # Hydra's own overrides too: +hydra.job.env_set.WANDB_API_KEY=<key> was saved in the run's .hydra/hydra.yaml
        overrides: list = []
        for key in ("hydra.overrides.task", "hydra.overrides.hydra"):
            node = OmegaConf.select(config, key, default=None)
            if node is not None:  # (an empty list is falsy, and to_container takes no plain list)
                overrides += OmegaConf.to_container(node, resolve=False)
        refuse_secrets(copy.deepcopy(config), overrides)
    except ConfigError as e:
        _config_failure(e)


def _check_folder(config: DictConfig, key: str) -> None:
    try:
        value = OmegaConf.select(config, key, throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return  # resolved only inside the job (a ${hydra:...} value): Hydra's own error then
    path = Path(str(value))
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            where = "it" if folder == path else f"{folder} (in its path)"
            _config_failure(ConfigError(
                f"{key}={value}: {where} is a file, not a folder: name another folder, or move the file"))
        if folder.is_dir():
            if not os.access(folder, os.W_OK | os.X_OK):
                _config_failure(ConfigError(
                    f"{key}={value}: {folder} is not writable here: name a folder you can write to"))
            return


def _config_failure(error: ConfigError) -> NoReturn:
    """A config error's one line on stderr (printed: logging is not set up before Hydra composes), and exit code 2."""
    failure = Failure("config", redact_text(str(error)))  # a key typed as another setting's value: masked
    print(failure.line, file=sys.stderr, flush=True)
    sys.exit(failure.exit_code)
