"""An OpenAI-compatible ``/v1/chat/completions`` endpoint on 127.0.0.1 for the embedded engine.

Requests are queued to one batcher thread. It collects requests until none has arrived for ``batch_window_ms``,
then runs them through ``Engine.generate`` calls of at most ``max_batch_size`` rows, in a fixed order. Requests tagged
``summrl_burst`` (the training loop's passes) are waited for until the whole burst has arrived, however slowly. Logprob
tokens are returned as ``token_id:<id>``, as ART's vLLM server does, so ART's tokenizer can map
them back exactly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import uvicorn
from fastapi import FastAPI, Header, HTTPException, Request
from pydantic import BaseModel, Field, field_validator, model_validator

from summrl.backends.disconnect import POLL_S, EventStream, unless_disconnected
from summrl.backends.embedded.compute import on_compute_thread
from summrl.backends.embedded.engine import Completion, Engine, Rows, SamplingParams
from summrl.backends.openai_errors import openai_errors
from summrl.backends.seed import Seed
from summrl.backends.stops import Stop, stop_sequences
from summrl.errors import run_async
from summrl.prompt import MESSAGE_FIELDS, chat_role, content_text, unsupported_chat, unsupported_message_fields
from summrl.rollout import Burst, sample_seed

log = logging.getLogger(__name__)


MAX_N = 128  # choices a request may ask for, as OpenAI bounds n: each is a row of the engine's batch and cache


class Message(BaseModel):
    role: str
    content: str  # the chat template reads text: OpenAI's other forms of it are read as text below

    model_config = {"extra": "allow"}

    @field_validator("role", mode="before")
    @classmethod
    def as_template_role(cls, role: Any) -> Any:
        """developer as system (SmolLM2's template wrote its default system prompt, then a "developer" turn); another
        role is a 400 naming it."""
        return chat_role(role)

    @field_validator("content", mode="before")
    @classmethod
    def as_text(cls, content: Any) -> Any:
        """Text parts and null as the chat template reads them (they were refused); an image part is a 400 naming its
        type."""
        return content_text(content)

    @model_validator(mode="after")
    def no_tools(self) -> "Message":
        """``tool_calls`` and the like are a 400 naming them: the template never read them."""
        if extra := unsupported_message_fields(self.model_extra or {}):
            raise ValueError(f"{', '.join(extra)} not supported (this server has no tools): send role, content and "
                             "optionally name")
        return self


class ChatRequest(BaseModel):
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)  # OpenAI's bounds, as trainer.temperature's
    top_p: Optional[float] = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    seed: Optional[Seed] = None  # checked here: a bad one would fail every request batched with it
    stream: Optional[bool] = None
    stream_options: Optional[dict[str, Any]] = None  # include_usage: a last chunk with the usage
    stop: Optional[Stop] = None  # up to 4 sequences, as OpenAI takes them: the text ends before one
    response_format: Optional[dict[str, Any]] = None  # json_object / json_schema: constrained decoding
    summrl_burst: Optional[Burst] = None  # an extension: wait for the burst's other rows (each choice is a row)

    model_config = {"extra": "allow"}

    @model_validator(mode="before")
    @classmethod
    def implemented(cls, body: Any) -> Any:
        """OpenAI's parameters this endpoint does not implement (logit_bias, tools, presence_penalty, ...) are a 400
        naming them: they were accepted and ignored, and the reply was not what was asked for. top_logprobs has its
        own 400 below."""
        if isinstance(body, dict) and (named := [k for k in unsupported_chat(body) if k != "top_logprobs"]):
            raise ValueError(f"{', '.join(named)}: not supported by this endpoint")
        return body

    @property
    def stops(self) -> tuple[str, ...]:
        return stop_sequences(self.stop)


@dataclass
class _Pending:
    prompt: list[int]
    params: SamplingParams
    use_lora: bool
    seed: Optional[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    burst: Optional[Burst] = None
    on_token: Optional[Callable[[int], None]] = None  # a streamed reply's: each token as it is drawn (on ``loop``)
    stops: Optional["_Stops"] = None  # the request's stop sequences, watched as the row is drawn


MAX_WAIT_S = 0.5  # a steady stream of requests still starts a batch this soon after its first
BURST_WAIT_S = 10.0  # an incomplete burst runs without the rest once none of them has arrived for this long


class Batcher:
    """Collects concurrent requests and runs compatible ones in one generate call."""

    def __init__(self, engine: Engine, max_batch_size: int, window_s: float, early: bool = False) -> None:
        """``early``: answer each request as soon as its rows end, not when the call's longest row does. Only where
        timing may decide what is batched next (``summrl.serve``): a training pass, a benchmark, or a judge on this
        engine gets its results together, so the calls after it are composed the same way every time."""
        self.engine = engine
        self.early = early
        self.max_batch_size = max_batch_size
        self.window_s = window_s
        self.queue: "queue.Queue[Optional[_Pending]]" = queue.Queue()
        self.batch_sizes: list[int] = []  # for tests and the perf command
        self.thread = threading.Thread(target=self._run, name="summrl-batcher", daemon=True)
        self.thread.start()

    def enqueue(self, prompt: list[int], params: SamplingParams, use_lora: bool, seed: Optional[int] = None,
                burst: Optional[Burst] = None, on_token: Optional[Callable[[int], None]] = None,
                stops: tuple[str, ...] = ()) -> asyncio.Future:
        """The row's completion, to come (await it); ``on_token(token)`` is called on this event loop as each is drawn. The row
        ends once one of ``stops`` has been drawn. Cancelling the future drops the row (from the queue, or from its
        generate call where it stops)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        watch = _Stops(self.engine, stops) if stops else None
        self.queue.put(_Pending(prompt, params, use_lora, seed, loop, future, burst, on_token, watch))
        return future

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=30)

    def _collect(self, first: _Pending) -> tuple[list[_Pending], bool]:
        """The requests that arrive within ``window_s`` of each other (at most ``MAX_WAIT_S`` after the first), however
        many, and every row of each burst among them: ``_run`` splits them into generate calls of ``max_batch_size``
        in a fixed order.

        The window restarts at each arrival. The first request of a burst reaches the batcher 30 to 60 ms before the
        rest (it rides the one warm connection; the others open theirs): with a 30 ms window counted from it, a val
        pass of 32 rows ran as 1 + 16 + 15 (the lone row alone took 7.1 s) and 16 documents posted at once to
        summrl.serve as 1 + 15 (27.8 s where one batch of 16 takes 21 s). A lone request waits ``window_s``.
        No window is long enough for a pass to arrive whole on every machine: the server tokenizes each request
        before queuing it, and on a 2-core Zen 3 a 64-row val pass of ``experiment=local`` arrived as 9 + 55 and 3 + 61
        with the 100 ms window, so its summaries, and the val reward, changed from run to run. A tagged burst is
        therefore collected whole."""
        batch, start = [first], time.monotonic()
        # an incomplete burst waits BURST_WAIT_S from its own rows' latest arrival: counted from any arrival, a steady
        # stream of untagged requests (a judge, a chat client) held the burst, and itself, back for ever
        burst_seen = start
        while True:
            waiting = _incomplete_bursts(batch)
            now = time.monotonic()
            timeout = burst_seen + BURST_WAIT_S - now if waiting else min(self.window_s, start + MAX_WAIT_S - now)
            try:
                item = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
            except queue.Empty:
                for burst, arrived in waiting:
                    log.warning(f"summrl: burst {burst.id}: {arrived} of its {burst.size} rows arrived, then none for "
                                f"{BURST_WAIT_S:.0f} s; generating these without the rest (this pass may not replay "
                                f"exactly)")
                break
            if item is None:
                return batch, True
            batch.append(item)
            if item.burst is not None:
                burst_seen = time.monotonic()
        return batch, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self.queue.get()
            if first is None:
                return
            batch, stop = self._collect(first)
            waited = len(batch)
            batch = [item for item in batch if not item.future.done()]  # a client that gave up while it waited
            if len(batch) < waited:
                log.info(f"summrl: {waited - len(batch)} rows were abandoned (their clients disconnected) before "
                         "they were generated")
            # Requests that sample differently run in separate generate calls.
            by_kind: dict[tuple, list[_Pending]] = {}
            for item in batch:  # a burst runs in calls of its own: what shares them must not depend on timing
                burst = None if item.burst is None else item.burst.id
                by_kind.setdefault((item.params.key(), item.use_lora, burst), []).append(item)
            calls = []
            for items in by_kind.values():
                # A row's logits depend (around 1e-5) on the rows beside it (the matrix products' blocking follows the
                # row count) and on its place among them, and they decide near-tied tokens and the logprobs the update
                # reads. So the rows are sorted, then split: the same requests, arriving in any order, run as the same
                # generate calls (a val pass of 96 rows as the same 64 + 32), and a repeated run, or another arm of a
                # sweep, samples the same summaries. Prompt first: a prompt's rows share one prefill and one KV cache
                # (engine.SharedPrefix), so they are kept together (by seed, 64 + 32 rows of 24 prompts made 44
                # prefills, and a job of algorithm_ablation_local took 25% longer).
                items.sort(key=lambda i: (i.prompt, i.seed is None, i.seed or 0))
                calls += [items[i:i + self.max_batch_size] for i in range(0, len(items), self.max_batch_size)]
            for items in calls:
                params = SamplingParams(
                    max_tokens=max(i.params.max_tokens for i in items),
                    temperature=items[0].params.temperature,
                    top_p=items[0].params.top_p,
                    response_format=items[0].params.response_format,
                )
                self.batch_sizes.append(len(items))

                def wanted(items=items) -> list[bool]:  # done: answered early, or cancelled (its client has gone)
                    return [not item.future.done() and not (item.stops and item.stops.hit) for item in items]

                def done(row: int, result: Completion, items=items) -> None:
                    _post(items[row].loop, _set_result, items[row].future, result)

                def drawn(tokens: list[Optional[int]], items=items) -> None:
                    for item, token in zip(items, tokens):
                        if token is not None and item.stops is not None:
                            item.stops.add(token)
                        if token is not None and item.on_token is not None and not item.future.done():
                            _post(item.loop, item.on_token, token)

                watched = any(item.on_token is not None or item.stops is not None for item in items)
                rows = Rows(max_tokens=[i.params.max_tokens for i in items], wanted=wanted,
                            done=done if self.early else None, tokens=drawn if watched else None)
                try:
                    results = on_compute_thread(self.engine.generate, [i.prompt for i in items], params,
                                                use_lora=items[0].use_lora, seeds=[i.seed for i in items], rows=rows)
                except Exception as e:  # report to every waiting request; keep serving
                    for item in items:
                        _post(item.loop, _set_exception, item.future, e)
                    continue
                gone = sum(item.future.cancelled() for item in items)
                if gone:
                    log.info(f"summrl: {gone} of {len(items)} rows were abandoned (their clients disconnected) and "
                             f"generated no further: the call ran {max(len(r.token_ids) for r in results)} of "
                             f"{params.max_tokens} tokens")
                for item, result in zip(items, results):  # (a row answered early: its future is done already)
                    _post(item.loop, _set_result, item.future, result)


def _incomplete_bursts(batch: list[_Pending]) -> list[tuple[Burst, int]]:
    """Each burst in ``batch`` with fewer rows than its size, and how many it has."""
    arrived = Counter(item.burst.id for item in batch if item.burst is not None)
    tags = {item.burst.id: item.burst for item in batch if item.burst is not None}
    return [(tags[key], count) for key, count in arrived.items() if count < tags[key].size]


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """``callback(*args)`` on the requester's event loop, from the batcher's thread. A loop closed meanwhile (its
    server stopped during the call: an interrupted benchmark) has no one waiting: dropped, not the thread's traceback."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def build_app(
    engine: Engine,
    batcher: Batcher,
    api_key: str,
    served_models: Callable[[], dict[str, bool]],
    default_max_tokens: int = 1024,
) -> FastAPI:
    """``served_models()`` maps each name this server answers to whether it uses the LoRA adapter."""
    app = FastAPI(title="summrl embedded inference")
    openai_errors(app)  # (FastAPI's shape and 422 for a bad field were not what OpenAI's clients expect)
    # FastAPI keeps its endpoints in a module-level cache, so these routes outlive the app. They reach the engine
    # through ``serving``, which InferenceServer.stop empties: a sweep's next job must not keep this one's weights.
    serving: dict[str, Any] = {"engine": engine, "batcher": batcher, "served_models": served_models}
    app.state.release = serving.clear

    def check_key(authorization: Optional[str]) -> None:
        if authorization != f"Bearer {api_key}":
            raise HTTPException(status_code=401, detail="invalid API key")

    @app.get("/v1/models")
    async def models(authorization: Optional[str] = Header(default=None)) -> dict:
        check_key(authorization)
        return {"object": "list",
                "data": [{"id": name, "object": "model", "owned_by": "summrl"} for name in serving["served_models"]()]}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest, raw: Request, authorization: Optional[str] = Header(default=None)) -> dict:
        check_key(authorization)
        engine, batcher, names = serving["engine"], serving["batcher"], serving["served_models"]()
        if request.model not in names:
            raise HTTPException(
                status_code=404,
                detail=f"model {request.model!r} is not served here; served: {', '.join(sorted(names))}",
            )
        if request.stream and request.logprobs:
            raise HTTPException(status_code=400, detail="logprobs: not supported with stream=true here; ask for them "
                                                        "without streaming")
        if request.top_logprobs:  # each token's alternatives are not kept: an empty list was a wrong answer
            raise HTTPException(status_code=400, detail="top_logprobs: not supported here (each sampled token's own "
                                                        "logprob is, with logprobs=true)")
        prompt = engine.encode_chat([m.model_dump(include=set(MESSAGE_FIELDS)) for m in request.messages])
        response_format = None
        if request.response_format and request.response_format.get("type") != "text":
            response_format = json.dumps(request.response_format, sort_keys=True)
            try:
                engine.grammar(response_format)
            except Exception as e:
                raise HTTPException(status_code=400, detail=f"response_format: {e}") from None
        params = SamplingParams(
            max_tokens=_completion_budget(engine, request, len(prompt), default_max_tokens),
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            response_format=response_format,
        )
        # A seed fixes the row's draws whatever else is batched with it. The first choice gets the seed, the others
        # seeds hashed from (seed, i): with seed + i, requests with seeds 1 and 2 shared n - 1 choices, so a client
        # asking again with the next seed got mostly the same candidates (vLLM draws a request's n from one generator)
        seeds = [None if request.seed is None else request.seed if i == 0 else sample_seed(request.seed, i)
                 for i in range(request.n)]
        if request.stream:
            events: asyncio.Queue = asyncio.Queue()
            futures = [batcher.enqueue(prompt, params, names[request.model], seed, request.summrl_burst,
                                       on_token=lambda token, i=i: events.put_nowait((i, token)), stops=request.stops)
                       for i, seed in enumerate(seeds)]
            for i, future in enumerate(futures):
                future.add_done_callback(lambda f, i=i: events.put_nowait((i, f)))

            async def end() -> None:  # the client gone (or the stream done): its rows stop being generated
                for future in futures:
                    future.cancel()

            return EventStream(_chat_stream(engine, request, prompt, futures, events, raw.is_disconnected), end)
        results = await unless_disconnected(asyncio.gather(*(
            batcher.enqueue(prompt, params, names[request.model], seed, request.summrl_burst, stops=request.stops)
            for seed in seeds
        )), raw.is_disconnected)
        return _chat_response(engine, request, prompt, results)

    return app


def _completion_budget(engine: Engine, request: ChatRequest, prompt_tokens: int, default: int) -> int:
    """The completion's token budget: what the request asks for, else ``default`` or what the context leaves.

    Past the model's context its positions are ones it never saw trained, and the engine reserves cache room for the
    whole budget: a request that does not fit is refused as vLLM refuses it (a 400 saying both lengths)."""
    asked = request.max_completion_tokens or request.max_tokens
    context = engine.context_length
    if context is None:
        return asked or default
    if prompt_tokens >= context:
        raise HTTPException(status_code=400, detail=(
            f"This model's maximum context length is {context} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages."))
    if asked is None:
        return min(default, context - prompt_tokens)
    if prompt_tokens + asked > context:
        field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        raise HTTPException(status_code=400, detail=(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the messages, {asked} in the completion). "
            f"Please reduce the length of the messages or {field} (at most {context - prompt_tokens} here)."))
    return asked


def _chat_response(engine: Engine, request: ChatRequest, prompt: list[int], results: list[Completion]) -> dict:
    choices = []
    for index, result in enumerate(results):
        content_ids = [t for t in result.token_ids if t not in engine.eos_ids]
        content, stopped = cut_at_stop(engine.decode(content_ids), request.stops)
        choice: dict[str, Any] = {
            "index": index,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop" if stopped else result.finish_reason,
            "logprobs": None,
        }
        if request.logprobs:
            choice["logprobs"] = {
                "content": [
                    {
                        "token": f"token_id:{token}",
                        "logprob": logprob,
                        "bytes": engine.token_bytes(token),
                        "top_logprobs": [],
                    }
                    for token, logprob in zip(result.token_ids, result.logprobs)
                ]
            }
        choices.append(choice)
    completion_tokens = sum(len(r.token_ids) for r in results)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt) + completion_tokens,
        },
    }


async def _chat_stream(engine: Engine, request: ChatRequest, prompt: list[int], futures: list[asyncio.Future],
                       events: asyncio.Queue, gone: Callable[[], Awaitable[bool]]) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format: each choice's text as its tokens are drawn, then its
    finish_reason; usage last when ``stream_options.include_usage``; then ``[DONE]``. ``events`` carries
    ``(choice, token)`` as tokens are drawn and ``(choice, future)`` when a choice ends. (The handler's
    ``EventStream`` cancels the rows however the stream ends, which stops them in the batcher.)"""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": request.model}
    usage = bool((request.stream_options or {}).get("include_usage"))

    def chunk(index: int, delta: dict, finish: Optional[str] = None) -> str:
        body = {**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return f"data: {json.dumps({**body, 'usage': None} if usage else body)}\n\n"

    texts = [_Text(engine) for _ in futures]
    held = [_Held(request.stops) for _ in futures]
    left = len(futures)
    for index in range(len(futures)):
        yield chunk(index, {"role": "assistant", "content": ""})
    while left:
        try:
            index, event = await asyncio.wait_for(events.get(), timeout=POLL_S)
        except asyncio.TimeoutError:
            if await gone():
                return
            continue
        if isinstance(event, int):
            if event not in engine.eos_ids:
                piece = held[index].release(texts[index].add(event))
                if piece:
                    yield chunk(index, {"content": piece})
            continue
        left -= 1
        try:
            result: Completion = event.result()
        except Exception as e:  # the engine failed: said in the stream, as OpenAI's servers say it
            error = {"message": f"{type(e).__name__}: {e}", "type": "server_error"}
            yield f"data: {json.dumps({'error': error})}\n\n"
            return
        rest = held[index].release(texts[index].rest([t for t in result.token_ids if t not in engine.eos_ids]),
                                   last=True)
        if rest:
            yield chunk(index, {"content": rest})
        yield chunk(index, {}, "stop" if held[index].stopped else result.finish_reason)
    if usage:
        completion = sum(len(f.result().token_ids) for f in futures)
        counts = {"prompt_tokens": len(prompt), "completion_tokens": completion,
                  "total_tokens": len(prompt) + completion}
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': counts})}\n\n"
    yield "data: [DONE]\n\n"


class _Text:
    """A streamed choice's text, token by token, as vLLM's incremental detokenizer does it: each new token is decoded
    with the few before it (a tokenizer may drop a leading space, or a character span tokens), in time linear in the
    text. A character still incomplete (its bytes in tokens to come) decodes as U+FFFD and waits."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.ids, self.sent = engine, [], ""
        self.prefix = self.read = 0  # decoded: ids[prefix:read] is the context of what is new after it

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.engine.decode(self.ids[self.prefix:self.read])
        now = self.engine.decode(self.ids[self.prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        self.sent += now[len(before):]
        return now[len(before):]

    def rest(self, token_ids: list[int]) -> str:
        """What the whole reply's text has past what was sent (its held-back last characters). Should the whole
        not begin with what was sent, what the last pieces held back, decoded as they were: never lost."""
        whole = self.engine.decode(token_ids)
        if whole.startswith(self.sent):
            return whole[len(self.sent):]
        return self.engine.decode(self.ids[self.prefix:])[len(self.engine.decode(self.ids[self.prefix:self.read])):]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` before the first of ``stops`` in it, and whether there was one."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if at < 0 else (text[:at], True)


class _Stops:
    """A row's stop sequences, watched as its tokens are drawn: ``hit`` once one has appeared in its text."""

    def __init__(self, engine: Engine, stops: tuple[str, ...]) -> None:
        self.text, self.stops, self.hit = _Text(engine), stops, False
        self.longest = max(len(s) for s in stops)

    def add(self, token: int) -> None:
        if self.hit or token in self.text.engine.eos_ids:
            return
        before = len(self.text.sent)
        self.text.add(token)
        self.hit = cut_at_stop(self.text.sent[max(0, before - self.longest + 1):], self.stops)[1]


class _Held:
    """A streamed choice's text held back where it may begin a stop sequence (a client must never see one), and cut
    where one begins."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops, self.held, self.stopped = stops, "", False

    def release(self, piece: str, last: bool = False) -> str:
        """What can be sent now of the text so far; ``last``: the choice has ended, nothing more is held."""
        if self.stopped:
            return ""
        text, self.stopped = cut_at_stop(self.held + piece, self.stops)
        if self.stopped or last:
            self.held = ""
            return text
        keep = max((n for s in self.stops for n in range(len(s) - 1, 0, -1) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InferenceServer:
    """uvicorn in a background thread, bound to 127.0.0.1 on ``port`` or, by default, on a free port."""

    def __init__(self, app: FastAPI, port: Optional[int] = None) -> None:
        # A free port is bound here and its socket handed to uvicorn: a port found free, then bound by uvicorn a
        # moment later, could be taken meanwhile by another process doing the same (two runs, a sweep's jobs).
        self.socket: Optional[socket.socket] = None
        if port is None:
            self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.socket.bind(("127.0.0.1", 0))
            port = self.socket.getsockname()[1]
        self.port = port
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.app = app
        sockets = None if self.socket is None else [self.socket]
        # serve() under our own event loop: Server.run() expects the thread to have a current event loop
        # in some uvicorn releases, and a background thread has none.
        self.thread = threading.Thread(target=lambda: run_async(self.server.serve(sockets)), name="summrl-inference",
                                       daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded inference server did not start on 127.0.0.1:{self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        if self.socket is not None and not self.thread.is_alive():  # uvicorn closes it once serving; not if it never
            self.socket.close()  # started (and one still serving after the wait keeps it)
        getattr(self.app.state, "release", lambda: None)()  # see build_app
