"""One line and one exit code per expected failure (README: "When a run fails").

``classify`` names the kind of an exception a user can act on (bad config, something missing, a failing
judge, no network, S3, W&B's key, SkyPilot) and words it as one line. Anything else is a bug, and keeps
its traceback. Light on purpose: exceptions are recognised by class name and module, so classifying
imports none of the libraries that raised them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Optional

# kind -> (exit code, how the line names it). 1 stays Python's own: an unexpected error, with its traceback.
KINDS = {
    "config": (2, "config error"),
    "preflight": (3, "preflight error"),
    "judge": (4, "judge error"),
    "network": (5, "network error"),
    "s3": (6, "S3 error"),
    "wandb": (7, "W&B authentication error"),
    "skypilot": (8, "SkyPilot error"),
}


NETWORK_FIX = "check the network connection (or HTTPS_PROXY)"


class NetworkError(ConnectionError):
    """A service this run needs could not be reached; the message names it and what was not checked."""


@dataclass
class Failure:
    kind: str
    message: str

    @property
    def exit_code(self) -> int:
        return KINDS[self.kind][0]

    @property
    def line(self) -> str:
        return f"summrl: {KINDS[self.kind][1]}: {self.message}"


def chain(e: BaseException) -> Iterator[BaseException]:
    """The exception, then its causes and contexts, outermost first."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _names(e: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__}


def _is_network(e: BaseException) -> bool:
    names = _names(e)
    return (isinstance(e, (ConnectionError, TimeoutError)) or "socket.gaierror" in names
            or any(n.startswith(("urllib3.exceptions.", "requests.exceptions.ConnectionError", "httpx.ConnectError",
                                 "httpx.ConnectTimeout", "botocore.exceptions.EndpointConnectionError",
                                 "aiohttp.client_exceptions.ClientConnectorError")) for n in names))


def is_network(e: BaseException) -> bool:
    """Whether a connection failed somewhere in ``e``'s chain (no network, a name that won't resolve)."""
    return any(_is_network(x) for x in chain(e))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def network_message(e: BaseException) -> str:
    """``e`` as one line: the host that could not be reached and why (``can't reach HOST: REASON``)."""
    errors = list(chain(e))
    hosts = [m.group(1) for x in errors for m in [re.search(r"host='([^']+)'", str(x))] if m]
    where = f"can't reach {hosts[0]}" if hosts else "a connection failed"
    return f"{where}: {_one_line(str(errors[-1])) or type(errors[-1]).__name__}"


def classify(e: BaseException) -> Optional[Failure]:
    """The expected failure ``e`` is, or None for a bug (or Ctrl-C), which keeps its traceback."""
    if not isinstance(e, Exception):
        return None
    from summrl.secrets import redact_text

    for x in chain(e):  # the outermost exception that says what failed wins; the causes explain
        names = _names(x)
        kind = None
        if "summrl.preflight.PreflightError" in names:
            kind = "preflight"
        elif "summrl.config.ConfigError" in names:
            kind = "config"
        elif "summrl.errors.NetworkError" in names:  # ours: it already says what and how to fix it
            kind = "network"
        elif "summrl.data.repliqa.DataError" in names:  # sizes the data can't meet; or the hub out of reach
            kind = "network" if is_network(x) else "config"
        elif names & {"summrl.loop.MissingRewardsError", "summrl.judges.llm.JudgeError"}:
            kind = "judge"
        elif "summrl.storage.StorageError" in names or any(n.startswith("botocore.exceptions.") for n in names):
            kind = "s3" if not _is_network(x) else None
        elif "wandb.errors.errors.AuthenticationError" in names or (
                "wandb.errors.errors.UsageError" in names and "api key" in str(x).lower()):
            kind = "wandb"
        elif any(n.startswith("sky.") for n in names) and not _is_network(x):
            kind = "skypilot"
        if kind is not None:
            text = str(x) if kind == "preflight" else _one_line(str(x))  # the preflight lists one item a line
            return Failure(kind, redact_text(text or type(x).__name__))
    if is_network(e):
        return Failure("network", redact_text(f"{network_message(e)}; {NETWORK_FIX}"))
    return None
