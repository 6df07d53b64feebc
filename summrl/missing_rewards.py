"""The run's missing rewards: the limit over a window of recent rollouts, and the totals result.json keeps.

One step of a few rollouts says little about a judge (2 failures of 8 is 25%, or noise), so the limit is
judged over the last ``trainer.missing_reward_window`` rollouts, train and val alike: the run stops once
more than ``max_missing_reward_rate`` of a full window's rollouts are missing. Early in the run that
needs that many failures already, so a judge that fails most calls stops the run within a step or two
and one that fails now and then never does.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Optional, Sequence, Union

from summrl.rewards import Missing, Score


class MissingRewardsError(RuntimeError):
    """Too many recent rollouts have no reward: the judge is failing, and training on the rest would mislead."""


class MissingRewards:
    def __init__(self, window: int, max_rate: float) -> None:
        self.window: deque[Optional[str]] = deque(maxlen=window)  # per rollout: None (scored) or its error's kind
        self.max_rate = max_rate
        self.scored = 0
        self.missing = 0
        self.by_kind: Counter[str] = Counter()  # the run's missing rewards by error kind
        self.last_error = ""

    def add(self, scores: Sequence[Union[Score, Missing]]) -> None:
        for score in scores:
            if isinstance(score, Missing):
                self.window.append(score.kind)
                self.missing += 1
                self.by_kind[score.kind] += 1
                self.last_error = score.error
            else:
                self.window.append(None)
                self.scored += 1

    def limit(self) -> float:
        return self.max_rate * self.window.maxlen  # type: ignore[operator]

    def check(self, judge: Any) -> None:
        """Raise MissingRewardsError, saying what failed, how often and what to do, once the window is over the limit."""
        kinds = Counter(k for k in self.window if k is not None)
        missing = sum(kinds.values())
        if missing <= self.limit():
            return
        by_kind = ", ".join(f"{kind} x{n}" for kind, n in kinds.most_common())
        name = getattr(judge, "model", judge.kind)
        endpoint = f" at {judge.api_base}" if getattr(judge, "api_base", None) else ""
        settings = (f"; raise judge.max_retries (now {judge.max_retries}) or judge.timeout_s (now {judge.timeout_s})"
                    if hasattr(judge, "max_retries") else "")
        last = " ".join(self.last_error.split())[:300]
        raise MissingRewardsError(
            f"{missing} of the last {len(self.window)} rollouts have no reward, over the limit of "
            f"trainer.max_missing_reward_rate={self.max_rate} of trainer.missing_reward_window={self.window.maxlen}. "
            f"Judge {name} failed with: {by_kind}; last error: {last}. "
            f"Check the judge{endpoint}{settings}, or allow more with trainer.max_missing_reward_rate."
        )

    def record(self) -> dict:
        """For result.json: the run's rollouts scored and missing, and the missing ones by error kind."""
        return {"scored": self.scored, "missing": self.missing, "missing_by_error": dict(self.by_kind)}
