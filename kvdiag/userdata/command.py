"""What `kvdiag probe --sessions FILE [--no-text]` adds to the probe command, in two steps:
before any server starts (the file named in the suite, validated whole), and between the
measurement and the summary (the free-text fact check; the text withheld)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


def with_sessions(suite, sessions: Path | None, fmt: str | None):
    """`suite` replaying `sessions` (validated now: KvdiagError, exit 2, at its first bad line),
    or `suite` as it is without a file. A format without a file is bad input."""
    from kvdiag.errors import KvdiagError
    from kvdiag.userdata.formats import sessions_file

    if sessions is None:
        if fmt not in (None, "auto") and not suite.sessions:
            raise KvdiagError("--sessions-format needs --sessions FILE")
        return suite
    fmt = None if fmt == "auto" else fmt
    return dataclasses.replace(suite, sessions=sessions_file(None, str(sessions), fmt),
                               sessions_format=fmt)


def sessions_digest(path: str) -> str:
    """The first 16 hex digits of the file's SHA-256, read in chunks (a regression baseline's
    key: the same name with other conversations is another baseline)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def score(measured) -> None:
    """The free-text fact check of a sessions-file probe, into its records and its plan's
    description (summary.json's sessions_file), before the summary reads them; nothing for
    generated sessions."""
    user = getattr(measured.plan, "user", None)
    if user and "fact_check" not in user:
        from kvdiag.userdata.score import score_free_text

        user["fact_check"] = score_free_text(measured.frame)


def finish(frame, fields: dict, run_dir: Path, no_text: bool):
    """(the records frame, the summary's fields) as the run writes them: with `no_text`, text
    withheld (kvdiag.userdata.privacy), rounds.jsonl too."""
    if not no_text:
        return frame, fields
    from kvdiag.userdata.privacy import withhold_fields, withhold_frame, withhold_rounds

    withhold_rounds(run_dir)
    return withhold_frame(frame), withhold_fields(fields) | {"text": "withheld"}
