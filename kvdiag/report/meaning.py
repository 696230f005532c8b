"""What a run's verdict means, in words, and the command that reruns it without overwriting.

Both read the typed summary (kvdiag.record.summary); every function here is pure (summary
in, string out).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdiag.record.summary import Summary

OUT_OPTIONS = ("--out", "-o")  # the run directory (or report file) options of the commands


def verdict_meaning(summary: Summary) -> str:
    """One or two sentences: the verdict and why, as the judge that decided it wrote it
    (summary.json's `reason`); the verdict's general meaning for runs written before
    `reason` existed. (A verdict outside the four never gets here: load_summary refuses it.)"""
    reason = summary.reason or summary.verdict.meaning
    return f"{summary.verdict.value.upper()}: {reason[:1].upper()}{reason[1:]}."


def rerun_command(command: str | None) -> str | None:
    """`command` without its --out / -o option, so a rerun writes a new run directory instead
    of into this one (new_run_dir never reuses one); None stays None."""
    if not command:
        return command
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes in an old summary: show it as recorded
        return command
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in OUT_OPTIONS:
            skip = True
        elif not word.startswith(tuple(f"{o}=" for o in OUT_OPTIONS)):
            kept.append(word)
    return shlex.join(kept)
