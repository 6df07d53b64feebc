"""A scripted, counting OpenAI-compatible server on 127.0.0.1: the judge for tests and `summrl.perf judge`.

Real HTTP, so the real litellm client path runs. Each request pops the next scripted reply (a JSON
reply, an HTTP status with headers, a delay, raw text); when the script is empty it answers like a
judge, after ``default_delay_s``: as many answers, verdicts, RULER scores, rubrics or rubric scores as the
prompt asks.
Usage counts prompt tokens with litellm's tokenizer, as a hosted judge would bill them.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from summrl.backends.embedded.server import InferenceServer


@dataclass
class Reply:
    content: Optional[str] = None  # the assistant message; None: answer like a judge
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def token_count(messages: list[dict]) -> int:
    import litellm

    return int(litellm.token_counter(model="gpt-4o", messages=messages))


def judge_like(prompt: str) -> str:
    trajectories = re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', prompt, re.S)
    if trajectories:  # RULER: score each summary by its length, so tests can check the mapping
        return json.dumps({"scores": [{"trajectory_id": i, "explanation": "by length", "score": min(1.0, len(t) / 1000)}
                                      for i, t in trajectories]})
    if '"positive_rubrics"' in prompt:  # rubric writing: one fact to keep, one error to avoid
        return json.dumps({"positive_rubrics": ["Names who opened it."], "negative_rubrics": ["Invents a date."]})
    if '"rubric_scores"' in prompt:  # rubric scoring: every rubric half met, per summary
        n, m = len(re.findall(r'^<summary id="\d+">', prompt, re.M)), len(re.findall(r"^R\d+\. ", prompt, re.M))
        return json.dumps({"rubric_scores": [[0.5] * m for _ in range(n)]})
    if '"answers"' in prompt:
        n = len(re.findall(r"^\d+\. ", prompt, re.M))
        return json.dumps({"answers": ["UNANSWERABLE"] * n})
    if '"correct"' in prompt:
        n = len(re.findall(r"^Candidate \d+: ", prompt, re.M))
        return json.dumps({"correct": [False] * n})
    return "A summary written by the fake policy."


class FakeLLM:
    def __init__(self, default_delay_s: float = 0.0) -> None:
        self.default_delay_s = default_delay_s
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
                reply = self.script.pop(0) if self.script else Reply(delay_s=self.default_delay_s)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.status != 200:
                # A hostile server echoes the caller's credentials back in its error body.
                return JSONResponse({"error": {"message": f"scripted {reply.status} for {request.headers.get('authorization')}"}},
                                    status_code=reply.status, headers=reply.headers)
            prompt = body["messages"][-1]["content"]
            content = reply.content if reply.content is not None else judge_like(prompt)
            prompt_tokens = token_count(body["messages"])
            with self.lock:
                self.prompt_tokens += prompt_tokens
            return {
                "id": f"fake-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(content.split()),
                          "total_tokens": prompt_tokens + len(content.split())},
            }

        self.server = InferenceServer(app)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> "FakeLLM":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()
