"""The client every LLM judge call goes through, via litellm: hosted (Gemini, OpenRouter) or any OpenAI-compatible
server, the embedded model included.

``JudgeClient`` makes one JSON-returning chat call with what a paid judge needs: a concurrency
limit, retries on 429/5xx/timeouts and on replies of the wrong shape, with exponential backoff and jitter
that honour Retry-After up to ``retry_max_s``, a per-call timeout, temperature 0, a disk cache of replies
keyed by (model, endpoint, messages, params) so reruns and sweeps don't pay twice, and token and USD
accounting from litellm's cost map. ``retrying`` is that retry loop for a caller that calls litellm itself
(RULER through ART), so that every judge call spends the same budget of attempts and is counted the same way.
The API key is read from the environment variable the config names, at call time; it is never
stored in config and is redacted from every error message. :func:`list_of` and :func:`list_schema` check and
constrain the JSON replies of the judge prompts (QA, grading, rubrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncContextManager, AsyncIterator, Awaitable, Callable, Optional, Union

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from summrl.errors import ExpectedFailure
from summrl.keys import key_names
from summrl.secrets import MIN_SECRET, SECRET_NAME, mask_keys


class JudgeError(ExpectedFailure, RuntimeError):
    """A judge call that failed after its retries. The message never contains the API key.

    ``kind`` names the last attempt's error (e.g. ``RateLimitError``, ``Timeout``, ``ReplyShapeError``), so that a
    run can count its failures by kind."""

    failure = "judge"

    def __init__(self, message: str, kind: str = "JudgeError") -> None:
        super().__init__(message)
        self.kind = kind


# The judge $ of the calls made in this asyncio context, where a caller set it ([0.0]): a client's usage is shared by
# every caller, so concurrent requests read each other's spending from it.
REQUEST_COST: contextvars.ContextVar[Optional[list[float]]] = contextvars.ContextVar("summrl_request_cost",
                                                                                       default=None)


def add_request_cost(cost: float) -> None:
    """A call's $ into the caller's own ``REQUEST_COST``, where one is set."""
    spent = REQUEST_COST.get()
    if spent is not None:
        spent[0] += cost


class SpendStopped(JudgeError):
    """A call not made because the caller's budget (``SPEND_GUARD``) had no room left for it. Not retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="SpendStopped")


# A caller's guard around each call of this asyncio context, retries included: entered before the call (raising
# SpendStopped when its budget has no room for it), left once the call is paid for. Question writing holds each
# document's calls to dataset.questions.max_cost_usd with it.
SPEND_GUARD: contextvars.ContextVar[Optional[Callable[[], AsyncContextManager[None]]]] = contextvars.ContextVar(
    "summrl_spend_guard", default=None)


class CallBudget:
    """A hard $ budget over units of paid work (a client's calls, retries too, as a ``SPEND_GUARD``; a benchmark's
    documents): a unit starts once ``spent()``, plus the price of the dearest unit so far for each unit in flight and
    for this one, fits the budget; until then it waits for units in flight to end, and with none in flight and no room
    it is SpendStopped, naming ``setting``. Until a unit's price is known, units run one at a time. A unit's price is
    what the judge calls and model calls in it add to ``REQUEST_COST``."""

    def __init__(self, spent: Callable[[], float], budget: float, setting: str) -> None:
        self.spent, self.budget, self.setting = spent, budget, setting
        self.dearest: Optional[float] = None
        self.in_flight = 0
        self.changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        async with self.changed:
            while self.in_flight and (self.dearest is None or self.spent()
                                      + (self.in_flight + 1) * self.dearest > self.budget):
                await self.changed.wait()
            spent = self.spent()
            if spent + (self.dearest or 0.0) > self.budget:
                raise SpendStopped(f"{self.setting}={self.budget:g} reached (${spent:.4f} spent): no room for another "
                                   "call")
            self.in_flight += 1
        outer, own = REQUEST_COST.get(), [0.0]
        token = REQUEST_COST.set(own)
        answered = False
        try:
            yield
            answered = True
        finally:
            REQUEST_COST.reset(token)
            if outer is not None:
                outer[0] += own[0]
            async with self.changed:
                self.in_flight -= 1
                if answered or own[0] > 0:  # (a call that failed unpaid says nothing of the price)
                    self.dearest = max(self.dearest or 0.0, own[0])
                self.changed.notify_all()


class ReplyShapeError(ValueError):
    """A reply that parses as JSON but has the wrong shape (item count, types, keys): retried like malformed JSON."""


class ReplyCutOff(ValueError):
    """A JSON reply the server stopped at its max_tokens (finish_reason "length") before the JSON ended: not retried
    (at temperature 0 the same reply is cut at the same place), and not blamed on the reply format."""


@dataclass
class JudgeUsage:
    calls: int = 0
    cached_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    retries: int = 0
    failures: int = 0
    unpriced_calls: int = 0  # replies with no token counts: their $ is unknown, not 0
    last_error: Optional[str] = None

    def snapshot_and_reset(self) -> dict[str, float]:
        """The counts since the last call, as ``judge/*`` metrics; the counters restart (last_error stays)."""
        values = {
            "judge/calls": float(self.calls),
            "judge/cached_calls": float(self.cached_calls),
            "judge/input_tokens": float(self.input_tokens),
            "judge/output_tokens": float(self.output_tokens),
            "judge/cost_usd": self.cost_usd,
            "judge/retries": float(self.retries),
            "judge/failed_calls": float(self.failures),
            "judge/unpriced_calls": float(self.unpriced_calls),
        }
        self.calls = self.cached_calls = self.input_tokens = self.output_tokens = self.retries = self.failures = 0
        self.unpriced_calls = 0
        self.cost_usd = 0.0
        return values


class RedactSecrets(logging.Filter):
    """Replaces the values of the named environment variables in log records (litellm logs its call
    arguments, the API key included, at DEBUG level)."""

    def __init__(self, env_names: set[str]) -> None:
        super().__init__()
        self.env_names = env_names

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = [v for v in (os.environ.get(n) for n in self.env_names) if v and len(v) >= MIN_SECRET]
        if secrets:
            message = record.getMessage()
            if any(secret in message for secret in secrets):
                for secret in secrets:
                    message = message.replace(secret, "***")
                record.msg, record.args = message, None
        return True


_REDACTOR = RedactSecrets(set())
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm")


def redact_in_logs(env_name: str) -> None:
    _REDACTOR.env_names.add(env_name)
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)


def quiet_litellm() -> None:
    """litellm's noise for a user: a log line per call at INFO (unless LITELLM_LOG asks for it), and its "Give
    Feedback / Get Help" banner after every failed call, which a retry may fix (the judge's error says what failed)."""
    import litellm

    litellm.suppress_debug_info = True
    if not os.environ.get("LITELLM_LOG"):
        for name in LITELLM_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


RETRYABLE_STATUS = {408, 409, 429}  # and every 5xx but 501 and 505: 529 is Anthropic's "overloaded", 52x Cloudflare's
NOT_RETRYABLE_5XX = {501, 505}


def _status(error: BaseException) -> Optional[int]:
    status = getattr(error, "status_code", None)
    return int(status) if isinstance(status, int) else None


def _retry_after(error: BaseException) -> Optional[float]:
    for headers in (getattr(error, "litellm_response_headers", None), getattr(getattr(error, "response", None), "headers", None)):
        try:
            value = headers.get("retry-after") if headers is not None else None
        except Exception:
            value = None
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None


def _is_retryable(error: BaseException) -> bool:
    import litellm

    if isinstance(error, (litellm.Timeout, litellm.APIConnectionError, asyncio.TimeoutError)):
        return True
    status = _status(error)
    return status in RETRYABLE_STATUS or (status is not None and 500 <= status < 600 and status not in NOT_RETRYABLE_5XX)


@dataclass
class JudgeClient:
    model: str
    api_key_env: Optional[str] = None
    api_base: Optional[str] = None
    max_concurrency: int = 20
    timeout_s: float = 60.0
    max_retries: int = 5
    retry_base_s: float = 1.0
    retry_max_s: float = 30.0
    cache_dir: Optional[str] = None
    # Send exact-count JSON schemas (json_schema) instead of json_object: the embedded judge decodes them
    # with a grammar, so a small model cannot return the wrong number of answers.
    structured: bool = False
    # what the reply cache keys the model by where api_base does not name it: the embedded judge's loopback URL has a
    # new port each run (its cache never hit) and says nothing of the weights behind it
    cache_identity: Optional[str] = None
    api_key: Optional[str] = field(default=None, repr=False)  # in memory only (the embedded endpoint's key)
    usage: JudgeUsage = field(default_factory=JudgeUsage)

    def __post_init__(self) -> None:
        # api_key_env, or litellm's own variables for a hosted model that names none (OPENAI_API_KEY): litellm reads
        # those itself, and a server may echo the key back in its error
        # only names that hold a key (not OLLAMA_API_BASE, a URL that errors must show)
        self._key_names = [n for n in key_names(self) if n == self.api_key_env or SECRET_NAME.search(n)]
        for name in self._key_names:
            redact_in_logs(name)
        quiet_litellm()
        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        self._cache = None
        if self.cache_dir:
            import diskcache

            # Never evicted: diskcache's default drops the oldest entries past 1 GiB (size_limit), and a reply it
            # dropped is paid for again. Stored in the cache's settings, so a cache opened before is changed too.
            self._cache = diskcache.Cache(str(Path(self.cache_dir).expanduser()), eviction_policy="none")

    def _api_key(self) -> Optional[str]:
        if self.api_key:
            return self.api_key
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise JudgeError(f"judge {self.model}: the environment variable {self.api_key_env} is not set",
                             kind="MissingKey")
        return key

    def litellm_params(self) -> dict[str, Any]:
        """Model endpoint, key and timeout for a caller that calls litellm itself (ART's RULER), through ``retrying``:
        litellm retries nothing, so that every retry is ours (counted, with Retry-After)."""
        params: dict[str, Any] = {"temperature": 0, "timeout": self.timeout_s, "num_retries": 0}
        key = self._api_key()
        if key or self.api_base:
            params["api_key"] = key or "none"
        if self.api_base:
            params["api_base"] = self.api_base
        return params

    def slot(self) -> asyncio.Semaphore:
        """The concurrency limit, for callers that call litellm themselves: ``async with client.slot(): ...``."""
        return self._semaphore

    def backoff_s(self, attempt: int) -> float:
        """Exponential backoff with jitter before retry number ``attempt + 1``."""
        return min(self.retry_max_s, self.retry_base_s * 2**attempt) * random.uniform(0.5, 1.0)

    def wait_s(self, attempt: int, error: BaseException) -> float:
        """The wait before retry number ``attempt + 1``: the backoff, or the server's Retry-After when longer, but
        never more than ``retry_max_s`` (a server that answers Retry-After: 3600 must not stall a run for an hour)."""
        return min(self.retry_max_s, max(self.backoff_s(attempt), _retry_after(error) or 0.0))

    def redact(self, text: str) -> str:
        return mask_keys(text, (*(os.environ.get(n) for n in self._key_names), self.api_key))

    @property
    def cache_endpoint(self) -> Optional[str]:
        """The endpoint as every cache (replies, rubrics, questions) keys it: the embedded judge's identity, else
        api_base."""
        return self.cache_identity or self.api_base

    def _cache_key(self, messages: list[dict], params: dict) -> str:
        blob = json.dumps([self.model, self.cache_endpoint, messages, params], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def cached_reply(self, messages: list[dict], params: dict) -> Any:
        """A reply another caller (RULER, through ART) asked for and stored with :meth:`keep_reply`; None: not
        cached. Counted as a cached call."""
        key = self._cache_key(messages, params)
        if self._cache is None or key not in self._cache:
            return None
        self.usage.cached_calls += 1
        return json.loads(self._cache[key])

    def keep_reply(self, messages: list[dict], params: dict, value: Any) -> None:
        if self._cache is not None:
            self._cache[self._cache_key(messages, params)] = json.dumps(value)

    async def complete_json(self, messages: list[dict], schema: Optional[dict] = None, max_tokens: int = 1024,
                            check: Optional[Callable[[Any], Any]] = None) -> Any:
        """One chat call whose reply must be a JSON object. Raises JudgeError after the retries.

        ``check`` turns the parsed reply into the caller's typed value, or raises ReplyShapeError: a reply of the
        wrong shape is retried (and counted) like malformed JSON, and never cached."""
        check = check or (lambda reply: reply)
        response_format: dict = {"type": "json_object"}
        if self.structured and schema is not None:
            response_format = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        params = {"temperature": 0, "max_tokens": max_tokens, "response_format": response_format}
        key = self._cache_key(messages, params)
        if self._cache is not None and key in self._cache:
            try:
                value = check(json.loads(self._cache[key]))
                self.usage.cached_calls += 1
                return value
            except ReplyShapeError:  # cached before this check existed: ask again
                pass

        flight = (asyncio.get_running_loop(), key)  # a future is awaited on its own event loop only
        asked = _ASKED.get(flight)
        if asked is not None:  # the same call is in flight (another reward term, another client): its reply will do
            outcome = await asyncio.shield(asked)
            if isinstance(outcome, JudgeError):
                raise outcome
            try:
                value = check(outcome) if outcome is not None else None
            except ReplyShapeError:
                value = None
            if value is not None:
                self.usage.cached_calls += 1
                return value
        parsed_reply: list[Any] = []

        def parse(text: str) -> Any:
            # strict=False: a raw tab or newline inside a string (models write them) is read, not retried; at
            # temperature 0 each retry gets the same reply, so it failed every time (a benchmark row left undone)
            parsed = json.loads(strip_fences(text), strict=False)
            value = check(parsed)
            if self._cache is not None:
                self._cache[key] = json.dumps(parsed)
            parsed_reply.append(parsed)
            return value

        ours = asyncio.get_running_loop().create_future()
        _ASKED.setdefault(flight, ours)  # (one asked meanwhile, by a caller that fell through above, stays the one)
        outcome: Any = None  # None: the callers waiting on this call ask for themselves
        try:
            value = await self._with_retries(messages, params, parse)
            outcome = parsed_reply[-1]
            return value
        except JudgeError as e:
            outcome = e
            raise
        finally:
            if _ASKED.get(flight) is ours:
                del _ASKED[flight]
            ours.set_result(outcome)

    async def complete_text(self, messages: list[dict], *, max_tokens: int, temperature: float,
                            check: Optional[Callable[[str], Any]] = None) -> tuple[Any, Optional[str]]:
        """One chat call whose reply is free text (a teacher's summary), with the same retries, counting and
        redaction as a judge's JSON call. Not cached: at temperature > 0 each call is a new sample. ``check`` may
        raise ReplyShapeError (e.g. an empty reply) to have the call retried. Returns (the checked text, the reply's
        finish_reason: "length" where max_tokens cut it)."""
        params = {"temperature": temperature, "max_tokens": max_tokens}
        check = check or (lambda text: text)

        async def attempt() -> tuple[Any, Optional[str]]:
            async with self._semaphore:
                response = await self._response(messages, params)
            # a reply that echoes the caller's key (a hostile or broken endpoint) is kept and trained on: masked
            return check(self.redact(response.choices[0].message.content or "")), response.choices[0].finish_reason

        return await self.retrying(attempt)

    async def _with_retries(self, messages: list[dict], params: dict, parse: Callable[[str], Any]) -> Any:
        async def attempt() -> Any:
            async with self._semaphore:
                text = await self._call(messages, params)
            return parse(text)

        return await self.retrying(attempt)

    async def retrying(self, attempt: Callable[[], Awaitable[Any]],
                       shape_errors: tuple[type[BaseException], ...] = (json.JSONDecodeError, ReplyShapeError)) -> Any:
        """Await ``attempt()`` (one judge call and the reading of its reply) until it returns: 429, 5xx, timeouts and
        ``shape_errors`` (a reply that is not JSON or has the wrong shape) are retried, up to ``max_retries`` times,
        with backoff and jitter (Retry-After honoured up to ``retry_max_s``), and counted in ``usage.retries``.
        Raises JudgeError, naming the attempts made and the last error's kind, after that (at once for an error no
        retry can fix, e.g. a refused key)."""
        def retryable(e: BaseException) -> bool:  # a bad reply is worth one more try, like a 5xx
            if isinstance(e, ReplyCutOff):
                return False
            return isinstance(e, shape_errors) or (isinstance(e, Exception) and not isinstance(e, JudgeError)
                                                   and _is_retryable(e))

        def counted(state: RetryCallState) -> None:
            self.usage.retries += 1

        async def guarded() -> Any:  # each attempt, the first too: a retry spends as a first call does
            guard = SPEND_GUARD.get()
            if guard is None:
                return await attempt()
            async with guard():
                return await attempt()

        retryer = AsyncRetrying(stop=stop_after_attempt(self.max_retries + 1), retry=retry_if_exception(retryable),
                                wait=lambda state: self.wait_s(state.attempt_number - 1, state.outcome.exception()),
                                before_sleep=counted, reraise=True)
        try:
            return await retryer(guarded)
        except JudgeError:  # already a judge's verdict (e.g. its key is not set): no retry can fix it
            raise
        except Exception as last:  # litellm maps every provider error to an exception with status_code
            self.usage.failures += 1
            message = self.redact(f"{type(last).__name__}: {last}")[:500]
            self.usage.last_error = message
            attempts = retryer.statistics.get("attempt_number", 1)
            raise JudgeError(f"judge {self.model} failed after {attempts} attempt(s): {message}",
                             kind=type(last).__name__) from None

    async def _call(self, messages: list[dict], params: dict) -> str:
        response = await self._response(messages, params)
        text = self.redact(response.choices[0].message.content or "")  # cached, and logged in records: never a key
        if params.get("response_format") and response.choices[0].finish_reason == "length":
            try:  # (one that ended exactly at the limit is whole)
                json.loads(strip_fences(text), strict=False)
            except ValueError:
                raise ReplyCutOff(f"the reply was cut off at max_tokens={params.get('max_tokens')} before its JSON "
                                  f"ended ({len(text)} characters)") from None
        return text

    async def _response(self, messages: list[dict], params: dict) -> Any:
        """One call, counted and priced."""
        import litellm

        response = await litellm.acompletion(
            model=self.model,
            messages=messages,
            api_key=self._api_key() or ("none" if self.api_base else None),
            api_base=self.api_base,
            timeout=self.timeout_s,
            num_retries=0,  # retries are ours, so that Retry-After and the counts are honoured
            **params,
        )
        self.usage.calls += 1
        self.account(response)
        return response

    def account(self, response: Any) -> float:
        """A response's tokens and litellm's price, into this client's usage and the caller's own (REQUEST_COST)."""
        import litellm

        usage = getattr(response, "usage", None)
        tokens = (int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0))
        self.usage.input_tokens += tokens[0]
        self.usage.output_tokens += tokens[1]
        if not any(tokens):  # a server that reports none: litellm prices it at $0
            self.usage.unpriced_calls += 1
        try:
            cost = float(litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # a model missing from litellm's cost map costs what we can't know: 0
            cost = 0.0
        self.usage.cost_usd += cost
        add_request_cost(cost)  # one caller's own share of a client many share (summrl.serve's requests)
        return cost


# Calls in flight, by cache key, so that an identical call asked meanwhile (two QA terms of one weighted reward answer
# the same summary's questions; each has its own client) waits for the reply instead of paying for it again. Each
# waiter gets the parsed reply (its own check applies), the call's JudgeError, or None (cancelled: it asks itself).
_ASKED: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future] = {}


def strip_fences(text: str) -> str:
    """A reply's JSON without the Markdown fence (```json ... ```) a model may wrap it in, and without the prose a model
    may write around that fence ("Here are the answers:"). Bare JSON is read as it is, up to its end: a fence inside
    one of its strings (a summary quoting code) is not the reply, and a line after it ("I hope this helps!") was
    refused as extra data, retried and paid for each time."""
    text = text.strip()
    if text.startswith(("{", "[")):
        try:
            return text[:json.JSONDecoder(strict=False).raw_decode(text)[1]]
        except ValueError:  # not JSON, or cut off: read as it is, and refused (or named cut off) as such
            return text
    match = (re.match(r"^```(?:json)?\s*(.*?)\s*```$", text, re.S)
             or re.search(r"^```(?:json)?[ \t]*\n(.*?)\n[ \t]*```[ \t]*$", text, re.S | re.M))
    return match.group(1).strip() if match else text


def list_of(reply: Any, key: str, n: int, types: Union[type, tuple[type, ...]]) -> list:
    """``reply[key]`` when it is a list of exactly ``n`` items of ``types``; otherwise ReplyShapeError (retried)."""
    items = reply.get(key) if isinstance(reply, dict) else None
    wants_bool = bool in (types if isinstance(types, tuple) else (types,))
    # true/false is an int to isinstance: an answer given as a boolean was graded as the answer "True"
    if (not isinstance(items, list) or len(items) != n or not all(isinstance(i, types) for i in items)
            or (not wants_bool and any(isinstance(i, bool) for i in items))):
        raise ReplyShapeError(f"expected {{\"{key}\": [{n} items]}}, got {json.dumps(reply)[:200]}")
    return items


def list_schema(key: str, items: dict, n: int) -> dict:
    """{key: [exactly n items]}."""
    return {"type": "object", "required": [key], "additionalProperties": False,
            "properties": {key: {"type": "array", "items": items, "minItems": n, "maxItems": n}}}
