"""The one thread that runs a process's torch compute: the embedded engine's loading, generation and training.

libgomp (torch's OpenMP) keeps a team of worker threads for every thread that has run a parallel region. Once those
outnumber the cores, it stops letting idle workers spin: each of the many small ops of a decode step then waits for
a sleeping worker to wake. Generation on the batcher's thread and training on asyncio's worker threads made two
teams on 2 cores: a decode step of 16 rows took 142 ms where the same step on a thread alone took 108 ms.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")
_here = threading.local()
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="summrl-compute",
                               initializer=lambda: setattr(_here, "compute", True))


def on_compute_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` on the compute thread and wait for its result (at once, when called from that thread)."""
    if getattr(_here, "compute", False):
        return fn(*args, **kwargs)
    return _executor.submit(fn, *args, **kwargs).result()


async def compute(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``on_compute_thread`` for a coroutine: the event loop goes on while ``fn`` runs."""
    if getattr(_here, "compute", False):
        return fn(*args, **kwargs)
    return await asyncio.wrap_future(_executor.submit(fn, *args, **kwargs))
