"""Per-round figures of a sessions-file probe on free text, from the probe's records.

    BLEU-4      of the shared answer against the isolated one: the `bleu4` every per-round
                table already computes (kvdiag.metrics.bleu), sacrebleu's signature kept
    fact check  every entity of the isolated answer still there, unchanged, in the shared
                one (kvdiag.metrics.entities); its pass rate per round gives SQDR

A generated session's fact check asks about its knowledge base; a user's conversation has
none, so its rows come out of the probe unchecked (NaN) and are checked here, before the
summary is made.
"""

from __future__ import annotations

import math

from kvdiag.userdata.formats import KIND

SHARED = "shared"  # kvdiag.runners.live.phases.SHARED (pressure rows are recorded under it too)
SHOWN = 8  # entities a failed row's reason names at most


def score_free_text(frame, spacy_model: str | None = "auto") -> dict:
    """Fill `fact_check_pass` and `fact_check_reason` of the free-text rows of `frame` (in
    place): shared rows against their isolated answer, isolated rows against themselves (1.0,
    or NaN without entities). Returns the summary's description of the check."""
    from kvdiag.metrics.entities import check, pipeline_name

    rows = frame.index[frame["kind"] == KIND]
    checked = 0
    for i in rows:
        reference, answer = frame.at[i, "reference_text"], frame.at[i, "output_text"]
        if frame.at[i, "allocator"] != SHARED:
            answer = reference
        result = check(reference, answer, spacy_model)
        frame.at[i, "fact_check_pass"] = result.passed
        checked += not math.isnan(result.passed)
        frame.at[i, "fact_check_reason"] = (
            "" if math.isnan(result.passed) else "ok" if result.passed else
            "missing: " + "; ".join(f"{e.kind} {e.text}" for e in result.missing[:SHOWN]))
    return {"pipeline": pipeline_name(spacy_model), "rows_checked": checked,
            "entities": "numbers, dates, proper nouns, identifiers in code, quoted titles",
            "compared": "the shared answer against the isolated one"}
