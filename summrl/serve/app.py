"""The server ``summrl.serve`` runs: a trained checkpoint behind an OpenAI-compatible API, plus ``/v1/summarize``.

Generation goes to the backend's own serving (:mod:`summrl.backends.serving`: the embedded engine and its batcher, or
ART's vLLM on a GPU) over its OpenAI endpoint on loopback, so concurrent requests are batched there. This app adds
what a user of a summarizer needs: the training prompt (``/v1/summarize``), best-of-N with a selector (RULER, the
document's rubrics, or length), a bearer key, clear HTTP errors that never stop the server (400, 401, 404, 413, 429,
503 while loading), recording to the run's inbox, and reloading a newer checkpoint between requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import os
import statistics
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

import httpx
import openai
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, TypeAdapter, ValidationError, field_validator

from summrl.backends import takes_burst_tags
from summrl.backends.disconnect import EventStream, unless_disconnected
from summrl.backends.openai_errors import BAD_REQUEST, error_response, openai_errors
from summrl.backends.seed import Seed
from summrl.backends.stops import Stop
from summrl.checkpoints import checkpoint_steps, resolve_step
from summrl.config import EMBEDDED_JUDGES, RubricRewardConfig, RulerRewardConfig
from summrl.data import Document
from summrl.data.documents import PART
from summrl.data.tokenizer import load_tokenizer
from summrl.inbox import Recorder
from summrl.judges.client import REQUEST_COST
from summrl.prompt import (MESSAGE_FIELDS, UNSUPPORTED_CHAT, SummaryPrompt, chat_role, chat_token_ids, content_text,
                           unsupported_chat, unsupported_message_fields, word_count)
from summrl.rewards.base import Missing
from summrl.secrets import redact_text
from summrl.serve.config import ServeConfig

log = logging.getLogger(__name__)


class SummarizeRequest(BaseModel):
    document: str
    id: Optional[str] = None  # recorded with the document (serve.record); default: the text's hash
    seed: Optional[Seed] = None  # checked here: the backend would refuse it only after its burst was announced

    # a field of OpenAI's (temperature, n) was ignored without a word, the server's settings answering instead;
    # strict: a seed of "12" or 1.0 is the client's mistake, said, not read as 12 or 1
    model_config = {"extra": "forbid", "strict": True}

    @field_validator("id")
    @classmethod
    def not_a_part(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and PART.search(value):
            raise ValueError("must not end with #part<k>, which names the parts of a document split for training")
        return value


class Service:
    """The loaded model, the selector, the inbox recorder, and the reload gate."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.step = config.step
        self.server: Any = None
        self.client: Any = None  # openai.AsyncOpenAI on the backend's endpoint
        self.inner = ""  # the name the backend serves the step under
        self.ready = False
        self.failed: Optional[str] = None  # why loading failed
        self.in_flight = 0
        self.waiting = 0  # requests waiting behind a reload: they count against serve.max_queue too
        self.served_s: deque[float] = deque(maxlen=32)  # the last requests' time in flight: a 429's Retry-After
        self.gate = asyncio.Lock()  # held by a reload: new requests wait; it waits for those in flight
        self.failed_reloads: set[int] = set()
        self.selector: Any = None
        self.recorder = Recorder(config.run.run_dir) if config.serve.record else None
        self.tokenizer: Any = None
        self.arrivals: Any = None  # serve.arrivals.Arrivals, for the embedded server: concurrent summaries as one burst
        self.stopping = False  # Ctrl-C or SIGTERM: requests still in flight after serve.shutdown_grace_s are cut
        s = config.serve
        key_env = s.api_key_env
        self.api_key = os.environ.get(key_env) if key_env else None

    @property
    def name(self) -> str:
        return f"{self.config.run.name}@{self.step}"

    def serves(self, model: Any) -> bool:
        """Whether a request's ``model`` names this server's: its ``<run>@<step>``, the run's name, or "summrl"."""
        return model in (self.name, "summrl", self.config.run.name)

    def not_served(self, model: Any) -> str:
        run = self.config.run.name
        if isinstance(model, str) and model.startswith(f"{run}@") and model != self.name:  # an earlier step's name
            return (f"model {model!r} is not served here: step {self.step} is ({self.name}); to follow the step "
                    f"served as it changes (serve.reload=auto), name the model {run!r}")
        return f"model {model!r} is not served here; served: {self.name} (or {run!r}, whichever step is served)"

    async def start(self) -> None:
        """Load the model, then the selector's judge (it may use the same endpoint); ``ready`` when done."""
        from summrl.backends.serving import start_server
        from summrl.storage import trained_config

        try:
            train = self.config.train
            # the run's model is the run's: its config says where, and only that can be changed
            fix = (f"the run's model.weights or model.base_model ({trained_config(self.config.run.run_dir)}) "
                   "must be readable on this machine")
            self.tokenizer = await asyncio.to_thread(load_tokenizer, train.model, fix)
            self.server = await start_server(train, self.config.run, early=True)  # each request as its rows end
            self.inner = await self.server.serve(self.step)
            self.client = openai.AsyncOpenAI(base_url=self.server.base_url, api_key=self.server.api_key or "none",
                                             max_retries=0, timeout=600)
            if takes_burst_tags(train):
                from summrl.serve.arrivals import Arrivals

                self.arrivals = Arrivals(train.backend.batch_window_ms / 1000)
            self.selector = self._selector()
            self.ready = True
            s = self.config.serve
            url = f"http://{f'[{s.host}]' if ':' in s.host else s.host}:{s.port}"  # an IPv6 address in brackets
            log.info(f"summrl: serving {self.name} on {url} (OpenAI base URL {url}/v1)"
                     f"{f' | best of {s.best_of_n} by {s.selector}' if s.best_of_n > 1 else ''}"
                     f"{' | recording to the inbox' if self.recorder else ''}"
                     f"{f' | reload: follows {self.config.follow}' if s.reload == 'auto' else ''}")
        except Exception as e:
            self.failed = redact_text(f"{type(e).__name__}: {e}")  # /health shows it, and asks no key
            raise

    def _selector(self) -> Any:
        s, train = self.config.serve, self.config.train
        if not s.judged:
            return None
        from summrl.judges import build_judge, embedded_endpoint

        endpoint = embedded_endpoint(train, self.server.base_url, self.server.api_key)  # base weights: the judge
        judge = build_judge(train.judge, endpoint if train.judge.kind in EMBEDDED_JUDGES else None)
        if s.selector == "ruler":
            from summrl.rewards.ruler import RulerReward

            rubric = getattr(train.reward, "rubric", None) or RulerRewardConfig().rubric
            return RulerReward(judge.client, rubric=rubric, prompt=SummaryPrompt.of(train.trainer))
        from summrl.rewards.rubric import RubricReward

        rubric = train.reward if train.reward.kind == "rubric" else RubricRewardConfig()
        return RubricReward(judge, max_rubrics=rubric.max_rubrics, positive_weight=rubric.positive_weight,
                            negative_weight=rubric.negative_weight, cache_dir=rubric.cache_dir)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    # ------------------------------------------------------------------ requests

    async def enter(self) -> float:
        """Wait for a place in flight; returns when it got in, for ``leave``. 429 past ``serve.max_queue``."""
        if self.failed:
            raise HTTPException(503, detail=f"the model failed to load: {self.failed}")
        if not self.ready:
            raise HTTPException(503, detail="the model is loading; GET /health says when it is ready",
                                headers={"Retry-After": "5"})
        if self.in_flight + self.waiting >= self.config.serve.max_queue:
            raise HTTPException(429, detail=f"{self.in_flight + self.waiting} requests in flight (serve.max_queue="
                                            f"{self.config.serve.max_queue}): retry shortly",
                                headers={"Retry-After": self.retry_after()})
        self.waiting += 1
        try:
            async with self.gate:
                self.in_flight += 1
                return time.monotonic()
        finally:
            self.waiting -= 1

    def leave(self, entered: float) -> None:
        self.in_flight -= 1
        self.served_s.append(time.monotonic() - entered)

    def retry_after(self) -> str:
        """A refused client's wait, in whole seconds: how long the recent requests were in flight (their median),
        about when a place frees. 1 before any has finished."""
        return str(max(1, math.ceil(statistics.median(self.served_s)))) if self.served_s else "1"

    async def watch(self) -> None:
        """serve.reload=auto: look for a newer checkpoint every ``serve.reload_check_s``, whether or not requests
        come, so that the new step is loaded (and ``/health`` reports it) once training has written it, rather than
        by the next request, which would wait for the load."""
        s = self.config.serve
        if s.reload != "auto":
            return
        while True:
            await asyncio.sleep(s.reload_check_s)
            if self.ready:
                try:
                    await self.maybe_reload()
                except Exception as e:  # the next look tries again; requests keep being served
                    log.error(redact_text(f"summrl: looking for a newer checkpoint failed: {type(e).__name__}: "
                                          f"{e}")[:300])

    async def maybe_reload(self) -> None:
        """Serve the step the config follows if training has written a newer one, between requests. A failed load
        keeps the previous step and logs one line (once per step)."""
        run = self.config.run
        run.steps = checkpoint_steps(run.checkpoints_dir)
        try:
            target = self.step if self.config.follow == "fixed" else resolve_step(run, self.config.follow)
        except Exception:
            return
        if target == self.step or target in self.failed_reloads:
            return
        async with self.gate:
            while self.in_flight:  # the requests of the step being replaced finish first
                await asyncio.sleep(0.01)
            try:
                self.inner = await self.server.serve(target)
            except Exception as e:
                self.failed_reloads.add(target)
                log.error(redact_text(f"summrl: reload of step {target} failed, still serving step {self.step}: "
                                      f"{type(e).__name__}: {' '.join(str(e).split())}")[:400])
                return
            log.info(f"summrl: reloaded: serving step {target} (was {self.step})")
            self.step = target

    async def generate(self, messages: list[dict], n: int, *, as_burst: bool = False,
                       gone: Optional[Callable[[], Awaitable[bool]]] = None, **params: Any) -> Any:
        """``as_burst``: sent with the requests that arrive with it, as one burst (embedded only). Only for requests
        the server is sure to accept (``/v1/summarize`` builds its own): a burst's rows that never reach the batcher
        hold the rest back 10 s. ``gone()``: whether the client has disconnected, which cancels the request to the
        model's server once the burst has formed (so a row leaves its burst short only if it goes in the
        milliseconds before it reaches the batcher)."""
        if as_burst and self.arrivals is not None:
            burst = await self.arrivals.join(n)
            params.update(burst.request_fields())
        extra_body = {**(self.server.extra_body or {}), **params.pop("extra_body", {})}  # the server's, the burst's
        return await unless_disconnected(self.client.chat.completions.create(
            model=self.inner, messages=messages, n=n, extra_body=extra_body or None, **params), gone)

    async def summarize(self, request: SummarizeRequest,
                        gone: Optional[Callable[[], Awaitable[bool]]] = None) -> dict:
        """``gone``: whether the client has disconnected (Starlette's ``Request.is_disconnected``)."""
        s, t = self.config.serve, self.config.train.trainer
        text = request.document.strip()
        if not any(c.isprintable() and not c.isspace() for c in text):  # zero-width spaces, NULs: nothing to read
            raise HTTPException(400, detail="document: empty; send {\"document\": \"<the text>\"}")
        # off the event loop: a long document would hold every other request (and /health) until it is counted
        tokens = len((await asyncio.to_thread(self.tokenizer, text, add_special_tokens=False))["input_ids"])
        if tokens > s.max_document_tokens:
            raise HTTPException(413, detail=f"document: {tokens} tokens, over serve.max_document_tokens="
                                            f"{s.max_document_tokens}; split it, or raise the limit")
        document = Document(id=request.id or hashlib.sha256(text.encode()).hexdigest()[:16], topic="", text=text,
                            questions=())
        messages = SummaryPrompt.of(t).messages(document)
        context = getattr(self.server, "context_length", None)
        if context is not None:  # the server would refuse it (and a burst would wait for it): checked first
            template = self.config.train.model.chat_template_kwargs
            prompt_tokens = len(await asyncio.to_thread(chat_token_ids, self.tokenizer, messages, **template))
            if prompt_tokens + t.max_summary_tokens > context:
                raise HTTPException(413, detail=f"document: {tokens} tokens; with the instructions ({prompt_tokens} in "
                                                f"all) and trainer.max_summary_tokens={t.max_summary_tokens} it needs "
                                                f"more than the model's context of {context} tokens; split it")
        temperature = t.temperature if s.temperature is None else s.temperature
        step = self.step
        try:
            response = await self.generate(messages, s.best_of_n, as_burst=True, gone=gone,
                                           max_tokens=t.max_summary_tokens, temperature=temperature, seed=request.seed)
        except HTTPException as e:
            if e.status_code == 499:  # said here: the model's server may not have seen the rows before they were cancelled
                log.info(f"summrl: document {document.id}: the client disconnected before its summaries were "
                         "generated; stopped")
            raise
        except openai.APIStatusError as e:  # vLLM's refusal where the context is not known here (max_model_len null)
            if e.status_code not in (400, 422):
                raise
            refused = _refused_parameter(e)
            if "context" in str(refused.detail):
                raise HTTPException(413, detail=f"document: {tokens} tokens; {refused.detail}; split it") from None
            raise refused from None
        samples = [c.message.content or "" for c in response.choices]
        if len(samples) > 1 and gone is not None and await gone():
            # nobody will read the choice: the judge (which may be paid) is not asked; the document is still recorded
            log.info(f"summrl: document {document.id}: the client disconnected before its {len(samples)} samples "
                     "were ranked; not ranked")
            chosen, score, fallback, cost = 0, None, "the client disconnected: not ranked", 0.0
        else:
            chosen, score, fallback, cost = await self.select(document, samples)
        recorded = None
        if self.recorder is not None:
            try:
                self.recorder.record(document.id, text, step)
                recorded = True
            except OSError as e:  # a full disk: the summary is still the client's; online learning misses it
                recorded = False
                log.error(redact_text(f"summrl: serve.record: document {document.id} not recorded: {type(e).__name__}: {e}"))
        return {"summary": samples[chosen], "words": word_count(samples[chosen]), "step": step, "model": self.name,
                "finish_reason": response.choices[chosen].finish_reason,  # "length": cut at trainer.max_summary_tokens
                "best_of_n": s.best_of_n, "selector": s.selector if s.best_of_n > 1 else None, "chosen": chosen,
                "rank_score": score, "judge_cost_usd": cost, "fallback": fallback, "recorded": recorded}

    async def select(self, document: Document, samples: list[str]) -> tuple[int, Optional[float], Optional[str], float]:
        """(index of the best sample, its score, why the first was returned instead (None), the judge's $)."""
        s, max_words = self.config.serve, self.config.train.trainer.max_words
        if len(samples) == 1:
            return 0, None, None, 0.0
        if s.selector == "length":  # the shortest within the limit (the shortest of all, when none is)
            words = [word_count(x) for x in samples]
            said = [i for i, w in enumerate(words) if w] or list(range(len(samples)))  # an empty one is no summary
            within = [i for i in said if words[i] <= max_words] or said
            best = min(within, key=lambda i: (words[i], i))
            return best, 1.0 - words[best] / max_words, None, 0.0
        spent = [0.0]  # this request's own calls (the client's usage is every request's)
        token = REQUEST_COST.set(spent)
        try:
            scores: list[Union[Any, Missing]] = await self.selector.score_group(document, samples)
        except Exception as e:  # a judge failure is never a 500: the first sample, and why
            # redacted before it is cut: a secret cut in two is no longer found
            scores, reason = [], redact_text(f"{type(e).__name__}: {e}")[:200]  # told to the client
        else:
            reason = redact_text(next((m.error for m in scores if isinstance(m, Missing)), ""))
        finally:
            REQUEST_COST.reset(token)
        cost = spent[0]
        ranked = [(x.reward, -i) for i, x in enumerate(scores) if not isinstance(x, Missing)]
        if not ranked:
            log.warning(f"summrl: warning: best-of-{len(samples)} selection failed, returned the first sample: {reason}")
            return 0, None, f"the judge failed, so the first sample is returned: {reason}", cost
        reward, negative_index = max(ranked)
        return -negative_index, float(reward), None, cost


def _refused_parameter(e: Any) -> HTTPException:
    """The backend's refusal of a parameter the client passed through (openai.APIStatusError, 400 or 422) as this
    server's 400, with the backend's message: the embedded server's in OpenAI's shape, vLLM's its own."""
    body = e.body if isinstance(e.body, dict) else {}
    message = str(body.get("message") or body.get("detail") or e.message)
    return HTTPException(400, detail=f"{BAD_REQUEST}{message.removeprefix(BAD_REQUEST)}")


# The chat fields this server reads, and OpenAI's that change nothing in a reply (user, metadata, store, ...). Any other
# (vLLM's top_k, min_p, min_tokens, ignore_eos, repetition_penalty) is refused by name: forwarded to no backend, it
# was dropped without a word.
CHAT_FIELDS = ("model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
               "logprobs", "response_format", "stream", "stream_options", "stop", "user", "metadata", "store",
               "service_tier")


STOP = TypeAdapter(Optional[Stop])


class NotJson(ValueError):
    """A number JSON has no way to write (NaN, Infinity, one past a float's range): Python's json reads them, and the
    backend's client then failed to send them (a 500)."""


def not_json(constant: str) -> float:
    raise NotJson(f"{constant} is not a JSON number")


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJson(f"{text} is out of a number's range")
    return value


def chat_messages(messages: list) -> list[dict]:
    """A chat's messages as the chat template reads them: text content (OpenAI's text parts, a line each), one of
    prompt.CHAT_ROLES (developer as system). Anything else is a 400 naming the message: a role like "robot" or "tool"
    went into the template and was sampled from, and text parts, which OpenAI's clients send, were refused."""
    out = []
    for i, message in enumerate(messages):
        where = f"bad request: messages.{i}"
        if not isinstance(message, dict):
            raise HTTPException(400, detail=f"{where}: must be an object with role and content")
        try:
            role = chat_role(message.get("role"))
        except ValueError as e:
            raise HTTPException(400, detail=f"{where}.role: {e}") from None
        try:
            content = content_text(message.get("content"))
        except ValueError as e:
            raise HTTPException(400, detail=f"{where}.content: {e}") from None
        if extra := unsupported_message_fields(message):
            raise HTTPException(400, detail=f"{where}: {', '.join(extra)} not supported (this server has no tools): "
                                            "send role, content and optionally name")
        out.append({k: v for k, v in message.items() if k in MESSAGE_FIELDS} | {"role": role, "content": content})
    return out


def max_body_bytes(serve: Any) -> int:
    """A request body's bound: 64 bytes per token of serve.max_document_tokens (a token is a few characters, each
    at most 6 bytes as a JSON escape), and at least 1 MiB for chat requests' messages."""
    return max(64 * serve.max_document_tokens, 1 << 20)


class Unexpected:
    """Any other exception of a request: the client gets it in OpenAI's shape, the log one masked line, and the server
    goes on. Not an ``exception_handler(Exception)``: Starlette runs that one in its outermost middleware, which raises
    the exception again after the reply, and uvicorn logged its whole traceback, unmasked (a key in a backend URL)."""

    def __init__(self, app: Any, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False
        where = f"{scope.get('method')} {scope.get('path')}"

        async def sending(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
            return
        except asyncio.CancelledError:
            if not self.service.stopping:
                raise
            # cut as the server stops: one line, where uvicorn logged the cancellation's traceback
            grace = self.service.config.serve.shutdown_grace_s
            log.warning(f"summrl: {where} was cut: still in flight serve.shutdown_grace_s={grace:g} s after the server "
                        "was told to stop")
            if not started:  # its client gets why, in OpenAI's shape (uvicorn sent a plain-text 500)
                await error_response(503, "the server is stopping: this request was still in flight "
                                          f"serve.shutdown_grace_s={grace:g} s after it was told to stop; send it to "
                                          "another server, or again once this one is back")(scope, receive, send)
            return
        except Exception as error:
            line = redact_text(" ".join(f"{type(error).__name__}: {error}".split()))[:300]
        # logged and answered outside the except block: a handler that fails to write prints its own traceback, and
        # inside the block that traceback went on with the error's, unmasked
        log.error(f"summrl: {where} failed: {line}")
        if not started:  # (a reply already begun, a stream, ends where it is)
            await error_response(500, f"internal error: {line}")(scope, receive, send)


def build_app(service: Service) -> FastAPI:
    # no /docs, /redoc or /openapi.json: they answered without the bearer key
    app = FastAPI(title="summrl serve", docs_url=None, redoc_url=None, openapi_url=None)

    openai_errors(app)

    app.add_middleware(Unexpected, service=service)

    def authorize(authorization: Optional[str]) -> None:
        scheme, _, key = (authorization or "").strip().partition(" ")
        # compared in constant time: how long a wrong key takes to refuse says nothing about the right one
        if service.api_key and not (scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(),
                                                                                       service.api_key.encode())):
            raise HTTPException(401, detail=f"missing or wrong bearer key (the server's {service.config.serve.api_key_env})",
                                headers={"WWW-Authenticate": "Bearer"})

    async def read_body(request: Request) -> bytes:
        """The body, refused (413) past what any document within serve.max_document_tokens needs: read whole, a huge
        one took the server's memory (216 MB: killed at 24 GB)."""
        limit = max_body_bytes(service.config.serve)
        declared = request.headers.get("content-length", "")
        too_big = HTTPException(413, detail=f"request body over {limit} bytes (serve.max_document_tokens="
                                            f"{service.config.serve.max_document_tokens} needs far fewer): split the "
                                            "document")
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
        return bytes(body)

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.ready:
            # in_flight: requests read and not yet answered, as serve.max_queue counts them
            return JSONResponse({"status": "ok", "model": service.name, "step": service.step,
                                 "in_flight": service.in_flight + service.waiting})
        return JSONResponse({"status": "failed" if service.failed else "loading", "error": service.failed},
                            status_code=503)

    started = int(time.time())

    def model_card() -> dict:
        return {"id": service.name, "object": "model", "created": started, "owned_by": "summrl", "step": service.step}

    @app.get("/v1/models")
    async def models(authorization: Optional[str] = Header(default=None)) -> dict:
        authorize(authorization)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, authorization: Optional[str] = Header(default=None)) -> dict:
        authorize(authorization)
        if not service.serves(model_id):
            raise HTTPException(404, detail=service.not_served(model_id))
        return model_card()

    @app.post("/v1/summarize")
    async def summarize(request: Request, authorization: Optional[str] = Header(default=None)) -> dict:
        authorize(authorization)
        # JSON whatever the Content-Type says: `curl -d '{"document": ...}'`, as the README shows it, sends
        # application/x-www-form-urlencoded
        try:
            parsed = SummarizeRequest.model_validate_json(await read_body(request))
        except ValidationError as e:
            raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in e.errors()]) from None
        entered = await service.enter()
        try:
            return await service.summarize(parsed, gone=request.is_disconnected)
        finally:
            service.leave(entered)

    @app.post("/v1/chat/completions")
    async def chat(request: Request, authorization: Optional[str] = Header(default=None)) -> dict:
        authorize(authorization)
        try:
            body = json.loads(await read_body(request), parse_constant=not_json, parse_float=finite_float)
            json.dumps(body, ensure_ascii=False).encode()  # a lone surrogate escape parses, and failed later as a 500
        except UnicodeEncodeError:
            raise HTTPException(400, detail="bad request: the body escapes a lone UTF-16 surrogate (e.g. \\ud83d), "
                                            "which is no character: send whole characters") from None
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested thousands deep (a 500)
            said = f" ({e})" if isinstance(e, NotJson) else ""
            raise HTTPException(400, detail=f"bad request: the body is not JSON{said}") from None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HTTPException(400, detail="bad request: messages: a non-empty list of chat messages is required")
        if body.get("stream") is not None and not isinstance(body["stream"], bool):
            raise HTTPException(400, detail=f"bad request: stream: must be true or false, got {body['stream']!r}")
        if body.get("stream_options") is not None and body.get("stream") is not True:  # as OpenAI and vLLM refuse it
            raise HTTPException(400, detail="bad request: stream_options: only with stream: true")
        try:  # here, not by the backend: vLLM takes more than 4, and an empty one
            STOP.validate_python(body.get("stop"))
        except ValidationError as e:
            raise HTTPException(400, detail=f"bad request: stop: {e.errors()[0]['msg']}") from None
        # said, not silently dropped: a client relying on them would get text they did not ask for
        unsupported = unsupported_chat(body)
        unsupported += sorted(k for k in body if k not in CHAT_FIELDS and k not in UNSUPPORTED_CHAT)
        if unsupported:
            raise HTTPException(400, detail=f"bad request: {', '.join(unsupported)}: not supported by this server "
                                            "(it samples the summarizer's text: max_tokens, temperature, top_p, seed, n, "
                                            "logprobs, response_format, stream, stop)")
        if not isinstance(body.get("model"), str):
            raise HTTPException(400, detail=f"bad request: model: required, the served model's id ({service.name})")
        n, max_n = 1 if body.get("n") is None else body["n"], service.config.serve.max_n
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= max_n:
            raise HTTPException(400, detail=f"bad request: n: must be an integer in 1..{max_n} (serve.max_n), "
                                            f"got {n!r}")
        for key in ("max_tokens", "max_completion_tokens", "seed", "temperature", "top_p"):
            # typed here: the embedded server's lenient parsing read true as 1 token and "1.5" as 1.5
            value, integer = body.get(key), key in ("max_tokens", "max_completion_tokens", "seed")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
                                      or (key != "seed" and integer and value < 1)):
                kind = "an integer" if key == "seed" else "an integer of at least 1" if integer else "a number"
                raise HTTPException(400, detail=f"bad request: {key}: must be {kind}, got {value!r}")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise HTTPException(400, detail=f"bad request: stream_options: must be an object, got {options!r}")
        flags = {"logprobs": body.get("logprobs"), "stream_options.include_usage": (options or {}).get("include_usage")}
        for key, value in flags.items():  # read as truthy by the backend: "yes" gave logprobs
            if value is not None and not isinstance(value, bool):
                raise HTTPException(400, detail=f"bad request: {key}: must be true or false, got {value!r}")
        messages = chat_messages(body["messages"])
        model = body.get("model")
        if not service.serves(model):  # before the queue: an unknown model is a 404 now, not a 429 or a wait
            raise HTTPException(404, detail=service.not_served(model))
        entered, streaming = await service.enter(), False
        try:
            if not service.serves(model):  # a reload while it waited replaced the step it named
                raise HTTPException(404, detail=service.not_served(model))
            params = {k: body[k] for k in ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
                                          "logprobs", "top_logprobs", "response_format", "stream",
                                          "stream_options", "stop") if body.get(k) is not None}
            try:
                response = await service.generate(messages, n, gone=request.is_disconnected, **params)
            except openai.APIStatusError as e:
                if e.status_code not in (400, 422):
                    raise
                raise _refused_parameter(e) from None
            if not body.get("stream"):
                return {**response.model_dump(exclude_none=True), "model": service.name}
            streaming = True  # in flight until its last chunk: a reload waits for it

            async def end() -> None:  # the client gone, or the stream done: the backend's stream (its rows) closed
                try:
                    await response.close()
                finally:  # the place in flight given back whatever closing did: a reload waits for every place
                    service.leave(entered)

            return EventStream(relay(response), end)
        finally:
            if not streaming:
                service.leave(entered)

    async def relay(stream: Any) -> AsyncIterator[str]:
        """The backend's chunks as they come, under the served model's name."""
        try:
            async for chunk in stream:
                yield f"data: {json.dumps({**chunk.model_dump(exclude_unset=True), 'model': service.name})}\n\n"
            yield "data: [DONE]\n\n"
        # the backend failed mid-stream (an error event, or its connection cut: httpx's error, which the openai
        # client's stream does not wrap): said in the stream, as OpenAI says it
        except (openai.APIError, httpx.HTTPError) as e:
            line = redact_text(" ".join(f"{type(e).__name__}: {e}".split()))[:300]
            log.error(f"summrl: a streamed chat failed: {line}")
            yield f"data: {json.dumps({'error': {'message': f'internal error: {line}', 'type': 'server_error'}})}\n\n"

    return app
