"""The cost guard, shared by the benchmark and sft=distill: before anything is called, the estimated model,
teacher and judge calls and their price from litellm's cost map; a prompt on stdin unless ``benchmark.confirm=false``
(``sft.confirm=false``).

Token counts are upper bounds where they depend on what a model writes: every summary is taken to be
``trainer.max_summary_tokens`` long. A model missing from litellm's cost map is priced "unknown", never $0.
Models served on this machine (checkpoints, judge=embedded, judge=lexical) are local and cost $0.

The judge calls each reward makes per group and per document, and their tokens, are sized here only: the cost guard
adds them up for the rows still to do, and the cloud estimate (summrl.cloud.pricing) for a whole run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence, TextIO

from summrl.data import Document
from summrl.prompt import SummaryPrompt


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

    def price(self) -> str:
        if self.local:
            return "local, $0"
        usd = self.usd
        return "unknown (not in litellm's cost map)" if usd is None else f"${usd:.4f}"

    def line(self) -> str:
        """``who: N calls, ~in input / <= out output tokens, $price``: one way to say it in every estimate."""
        return (f"{self.who}: {self.calls} calls, ~{self.input_tokens:,} input / <= {self.output_tokens:,} output "
                f"tokens, {self.price()}")


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


# --------------------------------------------------------------------------- the judge calls of each reward
#
# Tokens per call, summaries at trainer.max_summary_tokens (an upper bound), and the rubric prompts of
# summrl.judges.rubrics: up to max_rubrics rubrics a side, each up to 160 characters.
RUBRIC_TOKENS = 40  # one written rubric (160 characters)
RUBRIC_WRITE_PROMPT = 90  # WRITE_PROMPT without the document
RUBRIC_SCORE_PROMPT = 60  # SCORE_PROMPT without rubrics and summaries
RUBRIC_SCORE_TOKENS = 3  # one score in the reply ("0.5, ")


@dataclass(frozen=True)
class Sized:
    """A document's token counts."""

    prompt: int  # the policy's prompt (the document in the summary request): what RULER's judge reads
    text: int  # the document alone: what QA's baseline answers from and the rubric writer reads
    questions: int
    n_questions: int


def sized(document: Document, prompt: SummaryPrompt) -> Sized:
    def user(text: str) -> int:
        return prompt_tokens([{"role": "user", "content": text}])

    return Sized(prompt_tokens(prompt.messages(document)), user(document.text),
                 user(" ".join(q.question for q in document.questions)), len(document.questions))


@dataclass
class Tally:
    """Calls and their tokens; fractional where they are a mean scaled to a count (summrl.cloud.pricing)."""

    calls: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0

    def add(self, calls: float, input_tokens: float, output_tokens: float) -> "Tally":
        self.calls += calls
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        return self

    def plus(self, other: "Tally", times: float = 1.0) -> "Tally":
        return self.add(other.calls * times, other.input_tokens * times, other.output_tokens * times)

    def into(self, calls: Calls) -> int:
        """Add the tally (rounded) to ``calls``; returns the calls added."""
        count = round(self.calls)
        calls.calls += count
        calls.input_tokens += round(self.input_tokens)
        calls.output_tokens += round(self.output_tokens)
        return count


def qa_answers(d: Sized, n: int, read: int) -> Tally:
    """QA: ``n`` answering calls, each reading ``read`` tokens (a summary, or the document) and the questions."""
    return Tally().add(n, n * (read + d.questions + 80 + 40 * d.n_questions), n * 33 * d.n_questions)


def qa_group(d: Sized, n: int, summary: int) -> Tally:
    """QA: one answering call per summary, one grading call for the group."""
    return qa_answers(d, n, summary).add(1, 80, 0)


def ruler_group(d: Sized, n: int, summary: int) -> Tally:
    """RULER: one call ranks ``n`` summaries of the document (a group; for best-of-N, one summary's candidates)."""
    return Tally().add(1, d.prompt + n * summary + 400, 80 * n)


def rubric_group(max_rubrics: int, n: int, summary: int) -> Tally:
    """Rubric: one call scores the group on every rubric (up to max_rubrics a side)."""
    m = 2 * max_rubrics
    return Tally().add(1, RUBRIC_SCORE_PROMPT + m * RUBRIC_TOKENS + n * (summary + 10),
                       n * (RUBRIC_SCORE_TOKENS * m + 2) + 10)


def group_calls(rewards: Sequence[Any], d: Sized, n: int, summary: int) -> Tally:
    """The judge calls of one group scored by each of ``rewards`` (reward configs; kinds without judge calls add
    nothing): ``n`` summaries of one document, each ``summary`` tokens long."""
    t = Tally()
    for r in rewards:
        if r.kind == "qa":
            t.plus(qa_group(d, n, summary))
        elif r.kind == "ruler":
            t.plus(ruler_group(d, n, summary))
        elif r.kind == "rubric":
            t.plus(rubric_group(r.max_rubrics, n, summary))
    return t


def first_calls(rewards: Sequence[Any], d: Sized) -> Tally:
    """The calls made the first time a document is scored: each QA reward's full-document baseline (percent_full,
    one answering call, graded in the group's call), and the rubrics the judge writes, once per document and
    max_rubrics (the judge shares them between terms)."""
    t = Tally()
    for r in rewards:
        if r.kind == "qa":
            t.plus(qa_answers(d, 1, d.text))
    for max_rubrics in sorted({r.max_rubrics for r in rewards if r.kind == "rubric"}):
        t.add(1, d.text + RUBRIC_WRITE_PROMPT, 2 * max_rubrics * RUBRIC_TOKENS + 20)
    return t


# --------------------------------------------------------------------------- the cost guard


@dataclass
class Work:
    """What one benchmark entry still has to do: which model writes, n candidates per summary (best-of-N),
    and the pending rollouts of each document."""

    model_calls: Calls
    candidates: int  # 1, or n for best-of-N
    pending: dict[str, int]  # document id -> rollouts still to do
    # document id -> the model calls still to buy, where summaries (or candidates) paid for are kept to be scored
    # (the benchmark's generated.jsonl); None: every pending rollout's candidates
    to_buy: Optional[dict[str, int]] = None


def estimate(work: Sequence[Work], documents: Sequence[Document], judge: Calls, *, prompt: SummaryPrompt,
             max_summary_tokens: int, reward_uses_ruler: bool, qa_calls: bool,
             rubric_rewards: Sequence[Any] = ()) -> list[Calls]:
    """Fill in each entry's model calls and the judge's calls (answering, grading, RULER, and each rubric reward's
    scoring and, once per document, or per entry and document where it keeps no cache, its rubric writing) for the
    pending rows. The QA baseline (percent_full) is not counted: the benchmark does not pay for it."""
    by_id = {d.id: d for d in documents}
    counts: dict[str, Sized] = {}
    judged = Tally()
    for w in work:
        for doc_id, rollouts in w.pending.items():
            first = doc_id not in counts
            if first:
                counts[doc_id] = sized(by_id[doc_id], prompt)
            d = counts[doc_id]
            for r in rubric_rewards:  # (rubric rewards are LLM-judged: judge=lexical writes its own, offline)
                judged.plus(rubric_group(r.max_rubrics, rollouts, max_summary_tokens))
                if first or not r.cache_dir:
                    judged.plus(first_calls([r], d))
            calls = rollouts * w.candidates if w.to_buy is None else w.to_buy.get(doc_id, rollouts * w.candidates)
            w.model_calls.calls += calls
            w.model_calls.input_tokens += calls * d.prompt
            w.model_calls.output_tokens += calls * max_summary_tokens
            if qa_calls:  # an LLM grades QA (judge=lexical and judge=local grade it without calls)
                judged.plus(qa_group(d, rollouts, max_summary_tokens))
            if w.candidates > 1:  # best-of-N: RULER ranks each summary's candidates
                judged.plus(ruler_group(d, w.candidates, max_summary_tokens), rollouts)
            if reward_uses_ruler:  # reward=ruler ranks a document's rollouts as one group
                judged.plus(ruler_group(d, rollouts, max_summary_tokens))
    judged.into(judge)
    return [w.model_calls for w in work] + [judge]


def render(lines: Sequence[Calls], rows_total: int, rows_done: int) -> str:
    out = [f"summrl: benchmark plan: {rows_total - rows_done} of {rows_total} summaries to do "
           f"({rows_done} already in rows.csv)"]
    total, unknown = 0.0, []
    for line in lines:
        if line.calls == 0:
            continue
        usd = line.usd
        out.append(f"  {line.line()}")
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
