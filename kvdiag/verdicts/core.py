"""The one Verdict type every run gives (pass, fail, inconclusive, error: its exit code, rank
and meaning), and the Judgement a judge returns: the verdict and the sentence that says why."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 2 inconclusive or error."""
        return _EXIT[self]

    @property
    def meaning(self) -> str:
        return _MEANING[self]

    @property
    def passed(self) -> bool:
        return self is Verdict.PASS

    @classmethod
    def parse(cls, value) -> Verdict:
        """A recorded verdict (summary.json, history rows); anything unknown reads as error,
        never as a silent pass."""
        try:
            return cls(str(value).lower())
        except ValueError:
            return cls.ERROR

    @classmethod
    def worst(cls, verdicts: Iterable[Verdict]) -> Verdict:
        """fail > error > inconclusive > pass; error for none (no evidence is never a pass)."""
        return max(verdicts, key=_RANK.__getitem__, default=cls.ERROR)


_EXIT = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.INCONCLUSIVE: 2, Verdict.ERROR: 2}
_RANK = {Verdict.PASS: 0, Verdict.INCONCLUSIVE: 1, Verdict.ERROR: 2, Verdict.FAIL: 3}
_MEANING = {
    Verdict.PASS: "no corruption where none was expected, and every planted fault was caught",
    Verdict.FAIL: "corruption (or a regression) was found where none was expected",
    Verdict.INCONCLUSIVE: "the run proves nothing: the trigger was not reproduced or not reached",
    Verdict.ERROR: "the run's own ground truth is unsound, so nothing it measured can be judged",
}


@dataclass(frozen=True)
class Judgement:
    """A verdict and the one sentence that says why (the report's and the console's);
    `details`: what else the judge decided, for the run's record (a probe's: ProbeDetails;
    the other judges': a dict)."""

    verdict: Verdict
    reason: str
    details: Any = field(default_factory=dict)


def judge_unmeasured(reason: str) -> Judgement:
    """A run that could not be measured at all (a dead server, a baseline key mismatch, a
    fleet cell that raised or ran out of time): an error, never a pass."""
    return Judgement(Verdict.ERROR, reason)
