"""What a run's verdict means, in words, and the command that reruns it without overwriting.

Both read summary.json as written; every function here is pure (summary in, string out).
"""

from __future__ import annotations

import shlex

from kvdiag.verdicts import Verdict

OUT_OPTIONS = ("--out", "-o")  # the run directory (or report file) options of the commands


def verdict_meaning(summary: dict) -> str:
    """One or two sentences: the verdict and why, as the judge that decided it wrote it
    (summary.json's `reason`); the verdict's general meaning for runs written before
    `reason` existed. An unknown verdict word is said to be unknown."""
    word = str(summary.get("verdict", "")).lower()
    if word not in {v.value for v in Verdict}:
        known = ", ".join(v.value for v in Verdict)
        return f"Verdict {word or 'missing'!r}: not one this report knows ({known})."
    verdict = Verdict(word)
    reason = summary.get("reason") or verdict.meaning
    return f"{verdict.value.upper()}: {reason[:1].upper()}{reason[1:]}."


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
