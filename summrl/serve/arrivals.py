"""``/v1/summarize`` requests that reach ``summrl.serve`` together, sent on to the embedded server as one burst
(``rollout.Burst``).

The embedded batcher batches what reaches it within ``backend.batch_window_ms`` of each other, but a request's path to
it is not the same for all: the first of 16 concurrent requests rides the one warm connection to the engine's server
and is queued about 10 ms after it arrives, while the other 15 wait for this app and that server to tokenize the ones
before them. On a 2-core Zen 3 the second reached the batcher 153 ms after the first, past the 100 ms window: the
first ran alone (20 s) and the other 15 after it, 16 best-of-4 requests in 106 s where one call of all 64 rows took
86 s. Here, at the door, they arrive milliseconds apart; each is told the burst it belongs to (every row of the
requests that arrived within the window of each other), and the batcher collects a burst whole however late its rows
come.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Optional

from summrl.backends.embedded.server import MAX_WAIT_S
from summrl.rollout import Burst


@dataclass
class _Group:
    rows: int = 0
    started: float = field(default_factory=time.monotonic)
    closed: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    timer: Optional[asyncio.TimerHandle] = None


class Arrivals:
    """Groups requests as the embedded batcher groups rows: a group closes once none arrived for ``window_s``, or
    ``MAX_WAIT_S`` after its first (a steady stream still gets going)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._open: Optional[_Group] = None

    async def join(self, rows: int) -> Burst:
        """Wait for the group of this request (``rows`` samples) to close; its burst covers every row of the group."""
        group = self._open
        if group is None:
            group = self._open = _Group()
        group.rows += rows
        if group.timer is not None:
            group.timer.cancel()
        delay = min(self.window_s, group.started + MAX_WAIT_S - time.monotonic())
        group.timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._close, group)
        return await asyncio.shield(group.closed)  # a cancelled request leaves the burst short: the batcher says so

    def _close(self, group: _Group) -> None:
        if self._open is group:
            self._open = None
        group.closed.set_result(Burst.new(group.rows))
