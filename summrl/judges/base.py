"""What every judge is: the :class:`Judge` protocol, and a document's :class:`Rubrics`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol, Sequence, Union

from summrl.data import Document, Question

if TYPE_CHECKING:
    from summrl.judges.client import JudgeClient


@dataclass(frozen=True)
class Rubrics:
    """A document's rubrics: positives (facts a good summary keeps), negatives (errors it must avoid)."""

    positive: tuple[str, ...]
    negative: tuple[str, ...]

    @property
    def listed(self) -> tuple[str, ...]:
        return (*self.positive, *self.negative)


class Judge(Protocol):
    async def grade_group(self, texts: Sequence[str], questions: Sequence[Question]) -> list[Union[list[bool], Exception]]:
        """For each text, one verdict per question: was it answered correctly from that text alone?
        A text the judge could not grade gets the error instead (a JudgeError)."""
        ...

    def usage_metrics(self) -> dict[str, float]:
        """Calls, tokens and cost since the last call (``judge/*``); empty for offline judges."""
        ...

    # Who writes rubrics, for the rubric cache's key (model, endpoint, prompt version); None: written offline,
    # for free, so never cached.
    rubric_writer: Optional[str]

    async def write_rubrics(self, document: Document, max_rubrics: int) -> Rubrics:
        """At most ``max_rubrics`` positives and negatives for the document; JudgeError when the judge fails."""
        ...

    async def score_rubrics(self, document: Document, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
        """Per summary, a score in [0, 1] per rubric (``rubrics.listed``'s order): 1 when its statement holds."""
        ...

    # The LLM client that RULER asks to rank a group (reward=ruler); None for a judge with no LLM (judge=lexical,
    # which validation refuses for RULER).
    client: Optional[JudgeClient]
