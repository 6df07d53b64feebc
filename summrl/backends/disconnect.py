"""Stop work for a client that has gone. Starlette does not cancel a handler whose client disconnects: a chat of
16 × 400 tokens that its client gave up on kept the engine for 36 s, and every request after it waited."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, TypeVar

from fastapi import HTTPException
from fastapi.responses import StreamingResponse

T = TypeVar("T")
POLL_S = 0.25  # how often the connection is checked while the work runs


async def unless_disconnected(work: Awaitable[T], gone: Optional[Callable[[], Awaitable[bool]]]) -> T:
    """``work``'s result; cancelled once ``gone()`` (Starlette's ``Request.is_disconnected``) says the client has
    disconnected, then HTTP 499 (nginx's "client closed request", which no one reads). The embedded server's batcher
    stops generating a cancelled request's rows; the OpenAI client's request, cancelled, closes its connection, so
    the server behind it sees the disconnect too."""
    if gone is None:
        return await work
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a cancelled gather's error: read, not logged
    try:
        while not (await asyncio.wait({task}, timeout=POLL_S))[0]:
            if await gone():
                task.cancel()
                if task.done() and not task.cancelled() and task.exception() is None:
                    # done while ``gone()`` was asked: a stream opened for no one is closed, so its rows stop
                    close = getattr(task.result(), "close", None)
                    if inspect.iscoroutinefunction(close):
                        await close()
                raise HTTPException(499, detail="the client disconnected before its response")
        return task.result()
    finally:
        task.cancel()  # this handler cancelled (the server stopping): the work with it


class EventStream(StreamingResponse):
    """Server-sent events, with ``end()`` awaited however the response ends: streamed whole, its client gone
    mid-stream, or gone before the first byte (then Starlette never starts the events' generator, and a ``finally``
    in it never runs: a place in flight, or rows in the engine, were kept for no one)."""

    def __init__(self, events: AsyncIterator[str], end: Callable[[], Awaitable[None]]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.end = end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.end()
