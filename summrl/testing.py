"""Test double, not product: a scripted, counting OpenAI-compatible server on 127.0.0.1, the judge for the tests
and `summrl.perf judge`. Training, the benchmark and the judges never import it.

Real HTTP, so the real litellm client path runs. Each request pops the next scripted reply (a JSON
reply, an HTTP status with headers, a delay, raw text); when the script is empty it answers like a
judge, after ``default_delay_s``: as many answers, verdicts, RULER scores, rubrics or rubric scores as the
prompt asks.
Usage counts prompt tokens with litellm's tokenizer, as a hosted judge would bill them.

Fault mode (``faults=Faults(rate, seed)``): an unscripted request fails at ``rate`` with one of the five
ways a hosted judge misbehaves (FAULT_KINDS), drawn from a hash of (seed, prompt, how often that prompt was
asked): the same run meets the same faults whatever order its concurrent calls arrive in, and a retry of a
failed call draws again. A wrong shape is one of SHAPE_FAULTS (the wrong item count, items of the wrong type,
a missing key), drawn the same way, and is a reply no judge prompt accepts: QA answers and grades, RULER's
scores, rubric writing and rubric scoring. ``outcomes`` counts the calls by outcome (a wrong shape by its
variant). For a subprocess run:
``python -m summrl.testing --fault-rate 0.3 --seed 1`` prints its base URL; GET /stats returns
the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from summrl.backends.embedded.server import InferenceServer


@dataclass
class Reply:
    content: Optional[str] = None  # the assistant message; None: answer like a judge (status != 200: the error's)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    stream_error: Optional[str] = None  # streamed: an error event in place of the words after the first
    stream_cut: bool = False  # streamed: the connection cut after the first word (a server that died mid-stream)
    finish_reason: str = "stop"  # unstreamed: "length" as a server's reply cut at max_tokens
    usage: bool = True  # unstreamed: False for a server that reports no token counts


FAULT_KINDS = ("rate_limited", "server_error", "hang", "not_json", "wrong_shape")
SHAPE_FAULTS = ("wrong_count", "wrong_types", "missing_key")
OUTCOMES = ("ok", *FAULT_KINDS[:-1], *SHAPE_FAULTS)  # what ``FakeLLM.outcomes`` counts


@dataclass
class Faults:
    rate: float = 0.0
    seed: int = 0
    hang_s: float = 5.0  # past the client's timeout: set judge.timeout_s below it
    retry_after_s: str = "1"  # the Retry-After header of a 429
    only: Optional[tuple[str, ...]] = None  # inject only these outcomes (OUTCOMES but "ok"), drawn evenly

    def draw(self, key: str) -> Optional[str]:
        """The fault for this request (None: answer), a pure function of the seed and ``key``: a FAULT_KINDS entry,
        with a wrong shape named by its SHAPE_FAULTS variant."""
        digest = hashlib.sha256(f"{self.seed}:{key}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        if u >= self.rate:
            return None
        if self.only:
            return self.only[digest[8] % len(self.only)]
        kind = FAULT_KINDS[digest[8] % len(FAULT_KINDS)]
        return SHAPE_FAULTS[digest[9] % len(SHAPE_FAULTS)] if kind == "wrong_shape" else kind

    def reply(self, fault: str, prompt: str) -> Reply:
        if fault == "rate_limited":
            return Reply(status=429, headers={"Retry-After": self.retry_after_s})
        if fault == "server_error":
            return Reply(status=500)
        if fault == "hang":
            return Reply(delay_s=self.hang_s)
        if fault == "not_json":
            return Reply("Sure! Here are the answers you asked for.")
        return Reply(wrong_shape(fault, judge_like(prompt)))


def wrong_shape(fault: str, content: str) -> str:
    """A judge reply that parses but that no judge prompt accepts (a policy reply comes back unchanged).
    Every judge-like reply is ``{key: [items], ...}`` whose first list has the count its prompt asks for (answers,
    verdicts, RULER scores, rubric score rows) or, from the rubric writer, up to as many as asked, at least one:
    wrong_count drops its last item (empties the writer's list), wrong_types wraps each item in a list,
    missing_key drops the key."""
    try:
        reply = json.loads(content)
    except json.JSONDecodeError:
        return content
    key, items = next(iter(reply.items()))
    if fault == "wrong_count":
        return json.dumps({**reply, key: [] if key == "positive_rubrics" else items[:-1]})
    if fault == "wrong_types":
        return json.dumps({**reply, key: [[item] for item in items]})
    return json.dumps({k: v for k, v in reply.items() if k != key})


def token_count(messages: list[dict]) -> int:
    import litellm

    return int(litellm.token_counter(model="gpt-4o", messages=messages))


def fake_rubrics(prompt: str) -> dict[str, list[str]]:
    """The "up to N" positives and negatives a rubric-writing prompt allows, written as a judge would (a dozen words
    each, naming the document's facts, no two alike), so that the scoring prompts are as long as a real judge's."""
    n = int(re.search(r"up to (\d+) specific facts", prompt).group(1))
    words = re.search(r"<document>\n(.*?)\n</document>", prompt, re.S).group(1).split()
    step = max(1, (len(words) - 10) // n)

    def window(i: int) -> str:
        return " ".join(words[i * step:i * step + 10]).rstrip(".,;:")

    return {"positive_rubrics": [f"Mentions that {window(i)}." for i in range(n)],
            "negative_rubrics": [f"Changes a number, date or name in: {window(n - 1 - i)}." for i in range(n)]}


def judge_like(prompt: str) -> str:
    trajectories = re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', prompt, re.S)
    if trajectories:  # RULER: score each summary by its length, so tests can check the mapping
        return json.dumps({"scores": [{"trajectory_id": i, "explanation": "by length", "score": min(1.0, len(t) / 1000)}
                                      for i, t in trajectories]})
    if '"positive_rubrics"' in prompt:  # rubric writing: as many as asked, each from a sentence of the document
        return json.dumps(fake_rubrics(prompt))
    if '"rubric_scores"' in prompt:  # rubric scoring: every rubric half met, per summary
        n, m = len(re.findall(r'^<summary id="\d+">', prompt, re.M)), len(re.findall(r"^R\d+\. ", prompt, re.M))
        return json.dumps({"rubric_scores": [[0.5] * m for _ in range(n)]})
    if '"questions": [' in prompt:  # question writing: cloze questions from the document's sentences
        return json.dumps({"questions": fake_questions(prompt)})
    if '"answers"' in prompt:
        questions = re.findall(r"^\d+\. (.*)$", prompt, re.M)
        document = re.search(r"<document>\n(.*?)\n</document>", prompt, re.S)
        if document:  # open book: a cloze's blank filled from the document
            return json.dumps({"answers": [open_book_answer(q, document.group(1)) for q in questions]})
        if "general knowledge" in prompt:  # closed book: what "everyone knows"
            return json.dumps({"answers": [GENERAL_KNOWLEDGE.get(q.strip(), "UNANSWERABLE") for q in questions]})
        return json.dumps({"answers": ["UNANSWERABLE"] * len(questions)})
    if '"correct"' in prompt:  # a candidate is correct when it is the gold answer, ignoring case
        verdicts = []
        for block in prompt.split("\n\n"):
            gold = re.search(r"^Gold: (.*)$", block, re.M)
            for candidate in re.findall(r"^Candidate \d+: (.*)$", block, re.M):
                verdicts.append(bool(gold) and candidate.strip().lower() == gold.group(1).strip().lower())
        return json.dumps({"correct": verdicts})
    return "A summary written by the fake policy."


# The fake judge's "general knowledge": a question it answers with no document (tests plant it).
GENERAL_KNOWLEDGE = {"What is the capital of France?": "Paris"}


def fake_questions(prompt: str) -> list[dict[str, str]]:
    """As many questions as the writing prompt asks: clozes of the document's sentences (their last word masked,
    the answer), then the unanswerable ones."""
    answerable = int(re.search(r"^- (\d+) questions the document answers", prompt, re.M).group(1))
    unanswerable = int(re.search(r"^- (\d+) questions on the document's topic", prompt, re.M).group(1))
    document = re.search(r"<document>\n(.*?)\n</document>", prompt, re.S).group(1)
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n+", document) if len(s.split()) >= 4]
    questions = []
    for sentence in sentences[:answerable]:
        words = sentence.rstrip(".!?").split()
        questions.append({"question": f"Complete: {' '.join(words[:-1])} ____", "answer": words[-1]})
    questions += [{"question": f"What is the phone number of office {i + 1}?", "answer": "UNANSWERABLE"}
                  for i in range(answerable + unanswerable - len(questions))]
    return questions


def open_book_answer(question: str, document: str) -> str:
    """A cloze's missing word when the document has the sentence; UNANSWERABLE otherwise."""
    match = re.match(r"Complete: (.*) ____$", question)
    if match:
        found = re.search(re.escape(match.group(1)) + r" (\S+?)[.!?]?(?:\s|$)", document)
        if found:
            return found.group(1)
    return "UNANSWERABLE"


class FakeLLM:
    def __init__(self, default_delay_s: float = 0.0, faults: Optional[Faults] = None, port: Optional[int] = None) -> None:
        self.default_delay_s = default_delay_s
        self.faults = faults
        self.outcomes: Counter[str] = Counter()  # unscripted calls by outcome (OUTCOMES)
        self.asked: Counter[str] = Counter()  # how often each prompt was asked (a retry draws a new fault)
        self.script: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.prompt_tokens = 0  # summed over every answered request
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        @app.post("/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            with self.lock:
                self.requests.append(body)
                self.headers.append(dict(request.headers))
                reply = self.script.pop(0) if self.script else self.unscripted(body)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.status != 200:
                # A hostile server echoes the caller's credentials back in its error body.
                if reply.content is not None:  # an error in vLLM's shape
                    return JSONResponse({"object": "error", "message": reply.content, "type": "BadRequestError",
                                         "code": reply.status}, status_code=reply.status, headers=reply.headers)
                return JSONResponse({"error": {"message": f"scripted {reply.status} for {request.headers.get('authorization')}"}},
                                    status_code=reply.status, headers=reply.headers)
            prompt = body["messages"][-1]["content"]
            content = reply.content if reply.content is not None else judge_like(prompt)
            prompt_tokens = token_count(body["messages"])
            with self.lock:
                self.prompt_tokens += prompt_tokens
            if body.get("stream"):  # a word a chunk, as a server streams tokens
                return StreamingResponse(self.stream(body["model"], content, reply.stream_error, reply.stream_cut),
                                         media_type="text/event-stream")
            return {
                "id": f"fake-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": reply.finish_reason}],
                **({"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(content.split()),
                              "total_tokens": prompt_tokens + len(content.split())}} if reply.usage else {}),
            }

        @app.get("/stats")
        async def stats():
            with self.lock:
                return {"requests": len(self.requests), "outcomes": dict(self.outcomes)}

        self.server = InferenceServer(app, port=port)

    @staticmethod
    async def stream(model: str, content: str, error: Optional[str], cut: bool = False):
        head = {"id": "fake-stream", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        words = re.findall(r"\S+\s*", content)
        deltas = [{"role": "assistant", "content": ""}] + [{"content": word} for word in words]
        for i, delta in enumerate(deltas):
            if error is not None and i == 2:
                yield f"data: {json.dumps({'error': {'message': error, 'type': 'server_error'}})}\n\n"
                return
            if cut and i == 2:  # uvicorn closes the connection mid-body: the client reads an incomplete chunked body
                raise ConnectionAbortedError("the fake server's stream was cut, as scripted")
            yield f"data: {json.dumps({**head, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
        yield f"data: {json.dumps({**head, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
        yield "data: [DONE]\n\n"

    def unscripted(self, body: dict) -> Reply:
        """Under the lock: a judge-like reply, or the fault the fault mode draws for this request."""
        kind = None
        if self.faults is not None and self.faults.rate > 0:
            key = json.dumps(body["messages"], sort_keys=True)
            self.asked[key] += 1
            kind = self.faults.draw(f"{key}:{self.asked[key]}")
        self.outcomes[kind or "ok"] += 1
        if kind is None:
            return Reply(delay_s=self.default_delay_s)
        return self.faults.reply(kind, body["messages"][-1]["content"])  # type: ignore[union-attr]

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> "FakeLLM":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="A loopback OpenAI-compatible judge, optionally faulty.")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=5.0)
    parser.add_argument("--retry-after-s", default="1")
    args = parser.parse_args(argv)
    faults = Faults(args.fault_rate, args.seed, args.hang_s, args.retry_after_s)
    with FakeLLM(faults=faults, port=args.port or None) as server:
        print(server.base_url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
