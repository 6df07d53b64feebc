"""``python -m summrl.serve`` in a child process, started and waited for as a user would: the benchmark of serving
(``summrl.perf serve``) and the tests drive the real server through it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

from summrl.backends.embedded.server import free_port

ROOT = Path(__file__).resolve().parent.parent.parent


class ServeProcess:
    def __init__(self, run_dir: Path | str, args: list[str], log: Path, env: Optional[dict] = None,
                 timeout_s: float = 180) -> None:
        """Start the server on a free loopback port and return once ``GET /health`` answers 200. RuntimeError (with
        the end of its log) if it exits or is not ready within ``timeout_s``."""
        self.port, self.log = free_port(), Path(log)
        self.output = self.log.open("w")  # closed by stop()
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "summrl.serve", f"run_dir={run_dir}", f"serve.port={self.port}", *args],
            cwd=ROOT, stdout=self.output, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() - started > timeout_s:
                self.stop()
                raise RuntimeError(f"summrl.serve did not become ready: {self.log.read_text()[-3000:]}")
            time.sleep(0.3)
        self.load_s = time.monotonic() - started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()
