"""summary.json read back: which class a file is (a discriminated union on `kind`), the parse
every reader goes through (kvdiag.record.rundir.load_summary), and the JSON schema of every
kind (`kvdiag schema`, docs/summary.schema.json)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag, TypeAdapter

from kvdiag.record.summary import (
    SCHEMA_VERSION,
    AuditSummary,
    CompareSummary,
    IsolationSummary,
    MatrixSummary,
    ProbeSummary,
    RegressProbeSummary,
    RegressReferenceSummary,
    ReproduceSummary,
    Summary,
    VerifySummary,
)

KINDS: tuple[type[Summary], ...] = (ReproduceSummary, VerifySummary, ProbeSummary, AuditSummary,
                                    IsolationSummary, RegressReferenceSummary, RegressProbeSummary,
                                    MatrixSummary, CompareSummary)


def _tag(data: Any) -> str | None:
    """The class a summary is: its `kind`, except that both regress runs write kind "regress"
    (as they always have, so old files still read); a probe's own field, `style`, tells the
    live one from the reference engine's."""
    get = data.get if isinstance(data, dict) else lambda key: getattr(data, key, None)
    kind = get("kind")
    if kind == "regress":
        return "regress-probe" if get("style") is not None else "regress-reference"
    return kind if isinstance(kind, str) else None


KIND_NAMES = tuple(dict.fromkeys(cls.model_fields["kind"].default for cls in KINDS))
TAGS = {cls: cls.model_fields["kind"].default for cls in KINDS} | {
    RegressReferenceSummary: "regress-reference", RegressProbeSummary: "regress-probe"}
ANY_SUMMARY = TypeAdapter(Annotated[
    Union[tuple(Annotated[cls, Tag(TAGS[cls])] for cls in KINDS)],  # noqa: UP007 (built at runtime)
    Discriminator(_tag, custom_error_type="summary_kind",
                  custom_error_message=f"`kind` missing or unknown (one of {', '.join(KIND_NAMES)})")])


def parse_summary(data: dict) -> Summary:
    """A summary.json's dict as the class of its kind, validated: pydantic's ValidationError
    names the field (its location starts with the kind's tag)."""
    return ANY_SUMMARY.validate_python(data)


def json_schema() -> dict:
    """The JSON schema of summary.json: any one of the kinds (each names itself in `kind`)."""
    adapter = TypeAdapter(Union[KINDS])  # noqa: UP007 (a runtime tuple of classes)
    schema = adapter.json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://kvdiag.dev/schema/summary.json",
            "title": f"kvdiag summary.json (schema_version {SCHEMA_VERSION})", **schema}
