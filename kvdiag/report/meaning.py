"""What a run's verdict means, in words, and the command that reruns it without overwriting.

Both read summary.json as written; every function here is pure (summary in, string out).
"""

from __future__ import annotations

import shlex

from kvdiag.verdicts import EXIT_CODES, MEANING

VERDICTS = tuple(EXIT_CODES)  # pass, fail, inconclusive
OUT_OPTIONS = ("--out", "-o")  # the run directory (or report file) options of the commands


def verdict_meaning(summary: dict) -> str:
    """One or two sentences: what PASS / FAIL / INCONCLUSIVE says about this very run.

    A reproduce-style run (gates and faults in summary.json) names the allocators behind the
    verdict; a live probe (corrupted_requests) counts requests; anything else gets the
    general meaning. An unknown verdict word is said to be unknown.
    """
    verdict = str(summary.get("verdict", "")).lower()
    if verdict not in VERDICTS:
        return f"Verdict {verdict or 'missing'!r}: not one this report knows ({', '.join(VERDICTS)})."
    if "corrupted_requests" in summary:
        return _probe(summary, verdict)
    if "gates" in summary or "faults" in summary:
        return _reproduce(summary, verdict)
    return f"{verdict.upper()}: {MEANING[verdict]}."


def _reproduce(summary: dict, verdict: str) -> str:
    gates = summary.get("gates") or {}
    faults = summary.get("faults") or {}
    clean = [k for k, g in gates.items() if g.get("passed")]
    broken = [k for k, g in gates.items() if not g.get("passed")]
    caught = [k for k, findings in faults.items() if findings]
    missed = [k for k, findings in faults.items() if not findings]
    if verdict == "fail":
        text = (f"FAIL: {_names(broken) or 'a series'} expected to stay clean departed from "
                "the contiguous reference (ground truth).")
    elif verdict == "inconclusive":
        faulty = _names(missed) or "the faulty allocators"
        return (f"INCONCLUSIVE: the trigger was not reproduced: {faulty} (faulty by design) "
                "showed no corruption, so a clean result from the other allocators here "
                "proves nothing.")
    else:
        text = (f"PASS: {_names(clean) or 'every series'} expected to stay clean gave the "
                "contiguous reference's output in every round.")
    if caught:
        text += f" Corruption reproduced by the faulty {_names(caught)}, as intended."
    if missed and verdict == "pass":
        text += f" Not reproduced by {_names(missed)}."
    return text


def _probe(summary: dict, verdict: str) -> str:
    n = int(summary.get("corrupted_requests") or 0)
    if verdict == "fail":
        rounds = ", ".join(map(str, summary.get("corruption_rounds") or [])) or "?"
        return (f"FAIL: {n} request{'s' * (n != 1)} answered from the shared prefix cache "
                f"departed from {'their' if n != 1 else 'its'} cache-isolated run beyond the "
                f"noise floor (rounds {rounds}).")
    if verdict == "inconclusive":
        return ("INCONCLUSIVE: the server's prefix cache was not exercised as the trigger "
                "needs, so this probe can neither pass nor fail it.")
    return ("PASS: every request answered from the shared prefix cache matched its "
            "cache-isolated run, or departed only within the noise floor.")


def _names(keys: list[str]) -> str:
    return ", ".join(keys)


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
