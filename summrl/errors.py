"""One line and one exit code per expected failure (README: "When a run fails").

``classify`` names the kind of an exception a user can act on (bad config, something missing, a failing
judge, no network, S3, W&B's key, SkyPilot, a refused cost estimate, a failed SFT stage) and words it as one
line. Anything else is a bug, and keeps its traceback. Our own exceptions derive from :class:`ExpectedFailure`
and carry their kind; third-party ones are recognised by class name and module, so classifying imports none of
the libraries that raised them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Coroutine, Iterator, NoReturn, Optional, TypeVar

from summrl.secrets import redact_text

log = logging.getLogger(__name__)
T = TypeVar("T")

# kind -> (exit code, how the line names it). 1 stays Python's own: an unexpected error, with its traceback.
# Two kinds share a code on purpose: a failed SFT stage is the config/data code, and a refused cost estimate
# (sft=distill's teacher) exits 3 like the benchmark's cost guard.
KINDS = {
    "config": (2, "config error"),
    "preflight": (3, "preflight error"),
    "judge": (4, "judge error"),
    "network": (5, "network error"),
    "s3": (6, "S3 error"),
    "wandb": (7, "W&B authentication error"),
    "skypilot": (8, "SkyPilot error"),
    "sft": (2, "SFT error"),
    "remote": (100, "remote job failed"),  # SkyPilot's exit code for a failed job (the job's own: 103 cancelled)
    "not_confirmed": (3, "not confirmed"),
    "interrupted": (130, "interrupted"),  # Ctrl-C (SIGINT): 128 + 2, as a shell reports it; SIGTERM 143
}

# What stopped the process: cli.run sends SIGTERM (`kill`, a scheduler, a cancelled job) down Ctrl-C's path, which
# saves the record and closes the backend, and notes it here so the line and the exit code name the signal.
_stopped_by = signal.SIGINT


def stopped_by(signum: int) -> None:
    global _stopped_by
    _stopped_by = signal.Signals(signum)


def stop_signal() -> str:
    """How the interrupted line names what stopped the process."""
    return "Ctrl-C or SIGINT" if _stopped_by == signal.SIGINT else _stopped_by.name


@contextlib.contextmanager
def first_signal_only() -> Iterator[None]:
    """In the block, the first Ctrl-C (or SIGTERM, which cli.run sends down Ctrl-C's path) goes to the handler it
    would have reached (asyncio's runner cancels the run's task); those after it are ignored. Main thread only."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None:  # not the main thread, or a handler not set from Python: left as it is
        yield
        return
    first = [previous]

    def first_only(signum, frame):
        if first and callable(handler := first.pop()):
            handler(signum, frame)

    signal.signal(signal.SIGINT, first_only)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


async def finish_despite_a_signal(update: Callable[[], Awaitable[T]], what: str, dropped: str) -> tuple[T, bool]:
    """Await ``update()`` (a model update, which writes a checkpoint) to its end though Ctrl-C or SIGTERM comes:
    it goes on anyway (on its thread, or in the GPU's trainer), and its checkpoint must go with its records (a run
    resumed after it had lost them). Returns its result and whether a signal came: the caller records it, then
    stops. The signals after the first are let pass from before the update starts: the exit would wait for the
    update's thread anyway, and without the records."""
    with first_signal_only():
        task = asyncio.ensure_future(update())
        try:
            return await asyncio.shield(task), False
        except asyncio.CancelledError:
            log.warning(f"summrl: stopping once {what} are done (kill -9 stops now, dropping {dropped})")
            return await task, True


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, kept whatever ART imported. ``import art.local`` (backend=local_gpu) applies nest_asyncio
    to the whole process, which swaps ``asyncio.run`` for one that installs no Ctrl-C handler: a
    signal then raised KeyboardInterrupt wherever the main thread was, and one that came while a ``__del__`` ran
    was printed and dropped (the run went on). ``asyncio.Runner`` is not swapped: its handler cancels the run's
    task. Its loop is still re-entrant for ART: nest_asyncio patches the loop's class.

    The loop is built with Ctrl-C and SIGTERM held (:func:`signals_held`): one that came while it was built (a
    supervisor stopping ``summrl.serve`` as it starts) left it half built, and its ``__del__`` printed a traceback,
    with a warning that ``main`` was never awaited."""
    loop = None
    try:
        with signals_held():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # as the runner does with a loop of its own making
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(main)
    finally:
        main.close()  # a signal came before it started: closed, not warned about; once it has run, a no-op
        if loop is not None:
            asyncio.set_event_loop(None)
            loop.close()  # the runner has closed it, unless the signal came before the runner held it


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """In the block, Ctrl-C (and SIGTERM, which cli.run sends down Ctrl-C's path) waits; at its end it goes to the
    handler it would have reached. For a step that KeyboardInterrupt would leave half done. Main thread only."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(previous):  # not the main thread, or ignored, or a handler not set from Python: left as it is
        yield
        return
    held: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(signal.SIGINT, held[0])


def first_line(error: object) -> str:
    """An error's first line (at most 200 characters, secrets masked before it is cut), for a one-line message."""
    return (redact_text(str(error)).strip().splitlines() or [""])[0][:200]


NETWORK_FIX = "check the network connection (or HTTPS_PROXY)"
# The connection failures of the HTTP stacks the run uses (by class, subclasses included): a name that does not
# resolve, a refused or timed-out connection, a proxy that can't be reached.
NETWORK_ERRORS = (
    "socket.gaierror", "requests.exceptions.ConnectionError", "urllib3.exceptions.NewConnectionError",
    "urllib3.exceptions.ConnectTimeoutError", "urllib3.exceptions.NameResolutionError", "urllib3.exceptions.ProxyError",
    "httpx.ConnectError", "httpx.ConnectTimeout", "httpx.ProxyError", "botocore.exceptions.ConnectionError",
    "botocore.exceptions.ConnectionClosedError", "openai.APIConnectionError",
    "aiohttp.client_exceptions.ClientConnectorError",
)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
URL_HOST = r"https?://\[?([A-Za-z0-9._~:-]+?)\]?(?::\d+)?(?:/|$|\s|')"  # the host of a URL in a message


class ExpectedFailure(Exception):
    """A failure a user can act on: ``failure`` is its kind in KINDS (exit code, how its line names it). Every
    summrl exception of this sort derives from it, so classifying needs no import of the module that raised it."""

    failure: ClassVar[str] = "config"


class ConfigError(ExpectedFailure, ValueError):
    """A config value a user must fix. The message names the key and how to fix it."""


class NetworkError(ExpectedFailure, ConnectionError):
    """A service this run needs could not be reached; the message names it and what was not checked."""

    failure = "network"


@dataclass
class Failure:
    kind: str
    message: str
    code: Optional[int] = None  # the exit code, where the failure carries its own (a remote job's)

    @property
    def exit_code(self) -> int:
        if self.code is not None:
            return self.code
        if self.kind == "interrupted":
            return 128 + _stopped_by  # as a shell reports a process the signal ended
        return KINDS[self.kind][0]

    @property
    def line(self) -> str:
        return f"summrl: {KINDS[self.kind][1]}: {self.message}"


def chain(e: BaseException) -> Iterator[BaseException]:
    """The exception, then what explicitly caused it (``raise ... from``), outermost first. An exception raised
    while another was being handled (``__context__``) is not caused by it: a bug in an ``except`` block stays a bug."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__


def _history(e: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and contexts: only to describe a failure already classified (its host, its root)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _names(e: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__}


def _is_network(e: BaseException) -> bool:
    return isinstance(e, NetworkError) or bool(_names(e).intersection(NETWORK_ERRORS))


def _hosts(e: BaseException) -> list[str]:
    """The hosts named along ``e``'s history, outermost (the destination, not a proxy on the way) first."""
    hosts = []
    for x in _history(e):
        url = getattr(getattr(x, "request", None), "url", None)  # httpx and openai errors carry their request
        host = getattr(url, "host", None)
        if isinstance(host, str) and host:
            hosts.append(host)
        text = str(x)
        hosts += re.findall(r"host='([^']+)'", text) + re.findall(URL_HOST, text)
    return hosts


def is_network(e: BaseException) -> bool:
    """Whether ``e``, or what explicitly caused it, is a connection failure to another machine (no network, a name
    that won't resolve, a proxy). A refusal on loopback is not a network outage but a local server that is down
    (the embedded endpoint, say), unless it is the proxy's."""
    if not any(_is_network(x) for x in chain(e)):
        return False
    hosts = _hosts(e)
    proxy = any(n.endswith(".ProxyError") for x in _history(e) for n in _names(x))
    return proxy or not hosts or hosts[0].lower() not in LOOPBACK


def _one_line(text: str) -> str:
    return " ".join(text.split())


def network_message(e: BaseException) -> str:
    """``e`` as one line: the host that could not be reached and why (``can't reach HOST: REASON``)."""
    errors = list(_history(e))
    hosts = _hosts(e)
    where = f"can't reach {hosts[0]}" if hosts else "a connection failed"
    return f"{where}: {_one_line(str(errors[-1])) or type(errors[-1]).__name__}"


def _kind(x: BaseException) -> Optional[str]:
    if isinstance(x, ExpectedFailure):
        return x.failure
    names = _names(x)
    if any(n.startswith("botocore.exceptions.") for n in names):
        return None if _is_network(x) else "s3"
    if "wandb.errors.errors.AuthenticationError" in names or (
            "wandb.errors.errors.UsageError" in names and "api key" in str(x).lower()):
        return "wandb"
    if any(n.startswith("sky.") for n in names) and not _is_network(x):
        return "skypilot"
    return None


def classify(e: BaseException) -> Optional[Failure]:
    """The expected failure ``e`` is, or None for a bug (or Ctrl-C), which keeps its traceback."""
    if not isinstance(e, Exception):
        return None
    for x in chain(e):  # the outermost exception that says what failed wins; the causes explain
        kind = _kind(x)
        if kind is not None:
            text = str(x) if kind == "preflight" else _one_line(str(x))  # the preflight lists one item a line
            return Failure(kind, redact_text(text or type(x).__name__), getattr(x, "exit_code", None))
    if is_network(e):
        return Failure("network", redact_text(f"{network_message(e)}; {NETWORK_FIX}"))
    return None


def full_errors() -> bool:
    """Whether the user asked for tracebacks (HYDRA_FULL_ERROR=1; summrl.cli keeps their choice in
    SUMMRL_FULL_ERROR when it sets Hydra's variable for itself)."""
    return os.environ.get("SUMMRL_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", "")) == "1"


def exit_on(e: BaseException) -> NoReturn:
    """End a CLI on ``e``: its one line on stderr and its exit code. A bug, or HYDRA_FULL_ERROR=1, re-raises it
    (with its traceback). Call it from an ``except`` block."""
    failure = classify(e)
    if failure is None or full_errors():
        raise e
    end(failure)


def end(failure: Failure) -> NoReturn:
    """End a CLI with ``failure``'s one line and its exit code."""
    log.error(failure.line)  # stderr, and the run folder's log file (summrl.logs)
    sys.exit(failure.exit_code)
