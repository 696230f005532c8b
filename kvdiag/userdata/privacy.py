"""--no-text: a run's files keep token counts, metrics and hashes, and no text.

Withheld: every prompt, answer and expected text of results.parquet (each replaced by
`sha256:` and the first 16 hex digits of its SHA-256, so equal texts stay visibly equal),
the fact check's reasons (they name entities), token ids (a tokenizer turns them back into
text), the tokens summary.json quotes, and every text and token of rounds.jsonl (rewritten
when the run finishes: an interrupted run's rounds.jsonl still holds the answers it needs to
resume). A hash of a short answer can be found by trying candidates: it shows equality, it
does not hide a guessable text.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvdiag.record.evidence import FirstDivergence, PromptLogprobs

TEXT_COLUMNS = ("output_text", "reference_text", "expected_text")
ID_COLUMNS = ("output_token_ids", "reference_token_ids")
ROW_TEXT = ("text",)  # rounds.jsonl keys holding text, hashed
ROW_TOKENS = ("tokens", "top", "prompt_logprobs", "ids")  # ... token strings and ids, dropped


def digest(text) -> str:
    if not isinstance(text, str) or not text:
        return ""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def withhold_frame(frame):
    """A copy of the records frame without text (see the module docstring)."""
    out = frame.copy()
    for col in TEXT_COLUMNS:
        if col in out:
            out[col] = [digest(t) for t in out[col]]
    if "fact_check_reason" in out:
        out["fact_check_reason"] = ""
    for col in ID_COLUMNS:
        if col in out:
            out[col] = [[] for _ in range(len(out))]
    return out


def withhold_fields(fields: dict) -> dict:
    """ProbeSummary's fields without the tokens they quote."""
    firsts = [FirstDivergence.model_validate(f).model_copy(update={"shared_token": None, "isolated_token": None})
              for f in fields.get("first_divergences") or []]
    plp = PromptLogprobs.model_validate(fields.get("prompt_logprobs") or {})
    plp.examples = [e.model_copy(update={"shared": None, "isolated": None}) for e in plp.examples]
    return fields | {"first_divergences": firsts or None, "prompt_logprobs": plp}


def withhold_rounds(run_dir: Path) -> None:
    """rounds.jsonl rewritten without text (answers hashed, token strings dropped)."""
    path = Path(run_dir) / "rounds.jsonl"
    if not path.is_file():
        return
    tmp = path.with_suffix(".jsonl.tmp")
    with path.open() as src, tmp.open("w") as dst:
        for line in src:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill holds nothing finished
            row |= {k: digest(row[k]) for k in ROW_TEXT if k in row}
            row |= {k: [] for k in ROW_TOKENS if k in row}
            dst.write(json.dumps(row) + "\n")
    tmp.replace(path)
