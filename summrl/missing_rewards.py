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

from summrl.errors import ExpectedFailure
from summrl.rewards.base import Missing, Score


class MissingRewardsError(ExpectedFailure, RuntimeError):
    """Too many recent rollouts have no reward: the judge is failing, and training on the rest would mislead."""

    failure = "judge"


# What to do about each kind of judge error (JudgeError.kind: litellm's exception names, and ours).
KEY_ERRORS = ("AuthenticationError", "PermissionDeniedError", "MissingKey")  # 401, 403, an unset variable
RATE_ERRORS = ("RateLimitError",)  # 429
TIMEOUT_ERRORS = ("Timeout", "APITimeoutError", "TimeoutError")
# a reply that is not JSON, or JSON of the wrong shape (ART's RULER raises ValueError / pydantic's ValidationError)
SHAPE_ERRORS = ("JSONDecodeError", "ReplyShapeError", "ValueError", "ValidationError")
REQUEST_ERRORS = ("BadRequestError", "NotFoundError", "UnprocessableEntityError", "ContextWindowExceededError")


def fixes(kinds: Counter, judge: Any) -> list[str]:
    """What to do, for the kinds of error that happened, the most frequent first (each fix once)."""
    def setting(key: str) -> str:
        return f"judge.{key} (now {getattr(judge, key)})" if hasattr(judge, key) else f"judge.{key}"

    env = getattr(judge, "api_key_env", None)
    out: list[str] = []
    for kind, _ in kinds.most_common():
        if kind in KEY_ERRORS:
            fix = (f"check the key in {env}: the judge refused it or it is not set" if env
                   else "check the judge's key: the judge refused it")
        elif kind in RATE_ERRORS:
            fix = f"the judge is rate-limiting: lower {setting('max_concurrency')} or raise {setting('max_retries')}"
        elif kind in TIMEOUT_ERRORS:
            fix = f"calls time out: raise {setting('timeout_s')}"
        elif kind == "ReplyCutOff":  # before SHAPE_ERRORS: not the reply's format
            fix = ("the judge's replies are cut off at their max_tokens before their JSON ends (a reasoning model's "
                   "thinking counts against it): try another judge.model, or a smaller group "
                   "(trainer.rollouts_per_group, reward.max_rubrics)")
        elif kind in SHAPE_ERRORS:
            fix = "the judge model ignores the reply format (not JSON, or the wrong items): try another judge.model"
        elif kind in REQUEST_ERRORS:
            fix = "the judge refuses the request: check judge.model and judge.api_base"
        elif kind == "RubricsWeighNothing":  # no judge failed: the rubric reward's weights leave nothing to score
            fix = ("a document's rubrics all weigh 0: raise the rubric reward's reward.positive_weight or "
                   "reward.negative_weight (reward.terms.<term>.* in reward=weighted)")
        else:  # 5xx, connection errors, anything else
            fix = f"check that the judge is up, or raise {setting('max_retries')}"
        if fix not in out:
            out.append(fix)
    return out


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
        last = " ".join(self.last_error.split())[:300].rstrip(".")
        who = "judge" if name in last else f"judge {name}"  # a judge's own errors name it: once is enough
        raise MissingRewardsError(
            f"{missing} of the last {len(self.window)} rollouts have no reward, over the limit of "
            f"trainer.max_missing_reward_rate={self.max_rate} of trainer.missing_reward_window={self.window.maxlen}. "
            f"The {who}{endpoint} failed with: {by_kind}; last error: {last}. "
            f"To fix: {'; '.join(fixes(kinds, judge))}; or allow more with trainer.max_missing_reward_rate."
        )

    def record(self) -> dict:
        """For result.json: the run's rollouts scored and missing, and the missing ones by error kind."""
        return {"scored": self.scored, "missing": self.missing, "missing_by_error": dict(self.by_kind)}
