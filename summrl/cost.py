"""The cost guard, shared by the benchmark and sft=distill: before anything is called, the estimated model,
teacher and judge calls and their price from litellm's cost map; a prompt on stdin unless ``benchmark.confirm=false``
(``sft.confirm=false``).

Token counts are upper bounds where they depend on what a model writes: every summary is taken to be
``trainer.max_summary_tokens`` long. A model missing from litellm's cost map is priced "unknown", never $0.
Models served on this machine (checkpoints, judge=embedded, judge=lexical) are local and cost $0.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence, TextIO

from summrl.data import Document
from summrl.prompt import summary_messages


@dataclass
class Calls:
    who: str  # "model <id>" or "judge <id>"
    price_model: Optional[str]  # the litellm id to price; None: local ($0)
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def local(self) -> bool:
        return self.price_model is None

    @property
    def usd(self) -> Optional[float]:
        """$ from litellm's cost map; 0 for local; None when the model is not in the map."""
        if self.local or self.calls == 0:
            return 0.0
        return token_price(self.price_model, self.input_tokens, self.output_tokens)


def token_price(model: str, input_tokens: int, output_tokens: int) -> Optional[float]:
    import litellm

    try:
        prompt, completion = litellm.cost_per_token(model=model, prompt_tokens=input_tokens,
                                                    completion_tokens=output_tokens)
    except Exception:  # "This model isn't mapped yet"
        return None
    return float(prompt) + float(completion)


def prompt_tokens(messages: list[dict]) -> int:
    import litellm

    return int(litellm.token_counter(model="gpt-4o", messages=messages))


@dataclass
class Work:
    """What one benchmark entry still has to do: which model writes, n candidates per summary (best-of-N),
    and the pending rollouts of each document."""

    model_calls: Calls
    candidates: int  # 1, or n for best-of-N
    pending: dict[str, int]  # document id -> rollouts still to do


def estimate(work: Sequence[Work], documents: Sequence[Document], judge: Calls, *, max_words: int,
             max_summary_tokens: int, reward_uses_ruler: bool, qa_calls: bool) -> list[Calls]:
    """Fill in each entry's model calls and the judge's calls (answering, grading, RULER) for the pending rows."""
    by_id = {d.id: d for d in documents}
    prompt = {d.id: prompt_tokens(summary_messages(d, max_words)) for d in documents}
    for w in work:
        for doc_id, rollouts in w.pending.items():
            doc = by_id[doc_id]
            calls = rollouts * w.candidates
            w.model_calls.calls += calls
            w.model_calls.input_tokens += calls * prompt[doc_id]
            w.model_calls.output_tokens += calls * max_summary_tokens
            if qa_calls:  # an LLM grades QA (judge=lexical and judge=local grade it without calls)
                questions = prompt_tokens([{"role": "user", "content": " ".join(q.question for q in doc.questions)}])
                n_q = len(doc.questions)
                # one answering call per summary, one grading call per document (an upper bound)
                judge.calls += rollouts + 1
                judge.input_tokens += rollouts * (max_summary_tokens + questions + 80 + 40 * n_q) + 80
                judge.output_tokens += rollouts * 33 * n_q
            # RULER: (calls, candidates per call): best-of-N ranks each summary's n candidates, reward=ruler a group
            ruler = ([(rollouts, w.candidates)] if w.candidates > 1 else []) + ([(1, rollouts)] if reward_uses_ruler else [])
            for count, size in ruler:
                judge.calls += count
                judge.input_tokens += count * (prompt[doc_id] + size * max_summary_tokens + 400)
                judge.output_tokens += count * 80 * size
    return [w.model_calls for w in work] + [judge]


def render(lines: Sequence[Calls], rows_total: int, rows_done: int) -> str:
    out = [f"summrl: benchmark plan: {rows_total - rows_done} of {rows_total} summaries to do "
           f"({rows_done} already in rows.csv)"]
    total, unknown = 0.0, []
    for line in lines:
        if line.calls == 0:
            continue
        usd = line.usd
        price = "local, $0" if line.local else ("unknown (not in litellm's cost map)" if usd is None else f"${usd:.4f}")
        out.append(f"  {line.who}: {line.calls} calls, ~{line.input_tokens:,} input / <= {line.output_tokens:,} output "
                   f"tokens, {price}")
        if usd is None:
            unknown.append(line.who)
        else:
            total += usd
    tail = f" + unknown for {', '.join(unknown)}" if unknown else ""
    out.append(f"  estimated total: ${total:.4f}{tail} (summaries taken at trainer.max_summary_tokens: an upper bound)")
    return "\n".join(out)


def needs_confirmation(lines: Sequence[Calls]) -> bool:
    """Anything that is not local may cost money (an unknown price included)."""
    return any(line.calls and not line.local for line in lines)


def confirmed(stdin: TextIO = sys.stdin) -> bool:
    print("Proceed? [y/N] ", end="", flush=True)
    answer = stdin.readline()
    if not stdin.isatty():  # a piped answer is not echoed: end the prompt's line
        print(flush=True)
    return answer.strip().lower() in ("y", "yes")
