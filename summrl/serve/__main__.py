"""``python -m summrl.serve run_dir=runs/<name> [step=best|latest|<N>] [serve.*=...]``: serve a trained run.

A bad value or run folder ends with one line and exit code 2 before any model loads; so do a missing bearer key
(``serve.api_key_env``), a port in use and a host that is not this machine's. The server answers ``GET /health``
with 503 while the model loads, then 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
from typing import Any, Optional

import hydra
import uvicorn
from omegaconf import DictConfig

from summrl import cli
from summrl.errors import ConfigError, exit_on, run_async, stop_signal
from summrl.serve.config import validate_serve

log = logging.getLogger("summrl.serve")


class Server(uvicorn.Server):
    """uvicorn's server, less its re-raising of the signal that stopped it: raised after the shutdown, it cancelled
    closing the backend (two tracebacks, exit 1 on Ctrl-C). Ctrl-C or SIGTERM stops the server gracefully, exit 0:
    requests in flight get ``serve.shutdown_grace_s`` to finish, then each is cut with a line of its own."""

    def __init__(self, config: uvicorn.Config, service: Any) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        self.service.stopping = True
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            self.stopped_by = [signal.Signals(s).name for s in self._captured_signals]
            self._captured_signals.clear()


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening before the model loads: a port in use, or a host that is not this
    machine's, fails at once naming the setting (uvicorn would fail after the load started, exit 1). Raises
    ConfigError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart reuses a closing port
    try:
        sock.bind((host, port))
        # listening from here: a client that connects while the model's libraries import (about 6 s) waits for its
        # answer (503 while loading) instead of being refused
        sock.listen(2048)
    except (OSError, OverflowError) as e:
        sock.close()
        if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
            raise ConfigError(f"serve.port={port}: {host}:{port} is in use (another server is listening there): stop "
                              "it, or choose another serve.port") from None
        raise ConfigError(f"serve.host={host}: can't listen there ({getattr(e, 'strerror', None) or e}): use an "
                          "address of this machine, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every "
                          "interface)") from None
    return sock


async def serve(config, sock: socket.socket) -> None:
    from summrl.serve.app import Service, build_app  # heavy (openai, the backend): once the config is good

    service = Service(config)
    app = build_app(service)
    s = config.serve
    # no lifespan: the app has no startup or shutdown handlers, and uvicorn logged a cancelled lifespan's traceback
    # when Ctrl-C or SIGTERM came while the model loaded
    server = Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning", lifespan="off",
                                   timeout_graceful_shutdown=s.shutdown_grace_s), service)
    # uvicorn's words for the requests cut at the grace's end ("Cancel N running task(s)", then "returned without
    # completing response" for each): each says so itself, in one line (summrl.serve.app.Unexpected)
    logging.getLogger("uvicorn.error").addFilter(lambda record: not service.stopping or not str(record.msg).startswith(
        ("Cancel %s running", "ASGI callable returned without completing response")))
    loading = asyncio.create_task(service.start())  # /health says 503 until it is done

    def loaded(task: asyncio.Task) -> None:  # a model that can't load stops the server: no process left answering 503
        if not task.cancelled() and task.exception() is not None:
            server.should_exit = True

    loading.add_done_callback(loaded)
    watching = asyncio.create_task(service.watch())  # serve.reload=auto
    try:
        await server.serve(sockets=[sock])
    finally:
        loading.cancel()
        watching.cancel()
        await service.close()
    if service.failed:
        raise ConfigError(f"step={config.step}: the model could not be loaded ({service.failed}): serve another step, "
                          "or check the run's model settings")
    if getattr(server, "stopped_by", None):
        log.info(f"summrl: the server stopped ({', '.join(server.stopped_by)})")


@hydra.main(config_path="../../conf", config_name="serve", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        config = validate_serve(cfg)
        key_env = config.serve.api_key_env
        if key_env and not os.environ.get(key_env):
            raise ConfigError(f"serve.api_key_env={key_env}: the variable is not set; export {key_env}=<the key clients "
                              "must send>, or leave serve.api_key_env unset to serve without a key")
        sock = listening_socket(config.serve.host, config.serve.port)
        os.environ.setdefault("TQDM_DISABLE", "1")
        run_async(serve(config, sock))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before uvicorn took the signals (while the libraries import): the
        log.info(f"summrl: the server stopped ({stop_signal()})")  # same graceful stop, exit 0, as once it has
    except Exception as e:
        exit_on(e)


if __name__ == "__main__":
    cli.run(main)
