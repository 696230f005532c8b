"""Suites: YAML files -> frozen dataclasses, each value validated by pydantic (strict). Every
error names the file and the key.

A suite holds settings shared by its cases and a list of cases; a case may override any
shared setting. `kvdiag reproduce` runs the cases marked `default: true` unless told
otherwise (`--cases NAME,...` or `--cases all`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from kvdiag.errors import KvdiagError, SuiteError
from kvdiag.paths import SUITES
from kvdiag.planning.scenarios import CONDITIONS
from kvdiag.vocab import STYLES

# YAML has no NaN literal: a suite writes "nan" (vLLM #35138's other tenant fills with NaN)
Fill = Annotated[float, BeforeValidator(lambda v: math.nan if isinstance(v, str) and v.lower() == "nan" else v)]
# every number of a suite is range-checked on load, the field named (suite.yaml.block_size: ...)
Positive = Annotated[int, Field(gt=0)]
Count = Annotated[int, Field(ge=0)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]


@dataclass(frozen=True)
class Case:
    name: str
    condition: str = "trigger"  # one of kvdiag.planning.scenarios.CONDITIONS
    sessions: Positive = 16
    rounds: Positive = 12
    shared_prefix: Count = 3072  # tokens of the system prompt every session shares
    boundary: Positive = 4096  # the block boundary histories jump across (4095 -> 4112)
    start_range: tuple[Positive, Positive] = (3780, 4040)  # first prompt length of non-jumping sessions
    pressure_round: Count = 3  # the pool holds the histories as they stand after this round
    max_think: Count = 40  # engine steps a user may wait between turns
    recite_every: Count = 4  # every Nth round asks for a recitation (0: never)
    new_facts: tuple[Count, ...] = (0, 0, 1, 2)  # facts a later round states, drawn from these
    ask_recent: Share = 0.7  # a question targets the last two rounds' facts this often
    ask_new: Share = 0.3  # ... and a fact stated in the same round this often
    max_tokens: Positive = 48
    allocators: tuple[str, ...] = ()  # empty: the suite's allocators
    default: bool = True  # run by `kvdiag reproduce` without --cases
    ablation: bool = False  # a control: every allocator must stay flat
    recycled_block_fill: Fill | None = None  # nan models vLLM #35138's other tenant
    capture_attention: bool = True
    seed: Count | None = None  # None: the suite's seed
    style: str | None = None  # None: the suite's (canary or natural)
    min_turn: Count = 0  # a user turn adds at least this many tokens (long-answer-bearing turns)


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    description: str = ""
    style: str = "canary"
    model: str | None = None  # a model directory; None: the bundled canary
    seed: Count = 0
    block_size: Positive = 16
    max_num_seqs: Positive = 16
    allocators: tuple[str, ...] = ("buggy", "guarded")
    flavours: tuple[str, ...] = ("financial", "legal", "clinical")
    facts_per_session: Positive = 48
    cases: tuple[Case, ...] = ()
    sessions: str | None = None  # a sessions file (kvdiag.userdata) replayed instead of generated
    sessions_format: str | None = None  # openai or sharegpt; None: detected from the file

    def case(self, name: str) -> Case:
        for c in self.cases:
            if c.name == name:
                return c
        raise SuiteError(f"{self.path}: no case named {name!r} (cases: {', '.join(c.name for c in self.cases)})")

    def select(self, spec: str | None) -> list[Case]:
        """None: the default cases; 'all'; 'ablations'; or a comma-separated list of names."""
        if spec is None:
            return [c for c in self.cases if c.default]
        if spec == "all":
            return list(self.cases)
        if spec == "ablations":
            return [c for c in self.cases if c.ablation]
        return [self.case(n.strip()) for n in spec.split(",") if n.strip()]


def _tuples(value):
    """YAML lists as tuples, so strict validation takes them for tuple fields."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _build(cls, data: dict, where: str, skip: tuple[str, ...] = ()) -> dict:
    """The keys of a YAML mapping, each validated against dataclass `cls`'s field type by
    pydantic in strict mode (no "1" for 1, no true for 1); one SuiteError naming `where`
    and the key otherwise."""
    if not isinstance(data, dict):
        raise SuiteError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in fields(cls)} - set(skip)
    unknown = sorted(set(data) - names)
    if unknown:
        raise SuiteError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(names))})")
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for key, value in data.items():
        try:
            out[key] = _adapter(hints[key]).validate_python(_tuples(value))
        except ValidationError as e:
            first = e.errors()[0]
            inner = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first["loc"])
            raise SuiteError(f"{where}.{key}{inner}: {first['msg']} (got {first['input']!r})") from None
    return out


@functools.cache
def _adapter(typ) -> TypeAdapter:
    return TypeAdapter(typ, config=ConfigDict(strict=True))


def load_suite(path: str | Path) -> Suite:
    import yaml

    path = resolve_suite_path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise SuiteError(f"{path}: not valid YAML{at}") from None
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: the top level must be a mapping")
    raw_cases = data.pop("cases", None)
    defaults = data.pop("defaults", {}) or {}
    if not isinstance(raw_cases, list) or not raw_cases:
        raise SuiteError(f"{path}: cases: a non-empty list of cases is required")
    top = _build(Suite, data, str(path), skip=("path", "cases"))
    if "name" not in top:
        raise SuiteError(f"{path}: name: required")
    shared = _build(Case, defaults, f"{path}: defaults", skip=("name",))
    cases = []
    for i, raw in enumerate(raw_cases):
        where = f"{path}: cases[{i}]"
        if not isinstance(raw, dict) or "name" not in raw:
            raise SuiteError(f"{where}.name: required")
        case = Case(**(shared | _build(Case, raw, where)))
        _validate_case(case, where)
        cases.append(case)
    if len({c.name for c in cases}) != len(cases):
        raise SuiteError(f"{path}: cases: two cases share a name")
    if top.get("sessions"):  # relative to the suite file; validated now, before any server starts
        from kvdiag.userdata.formats import sessions_file

        top["sessions"] = sessions_file(path, top["sessions"], top.get("sessions_format"))
    suite = Suite(path=path, cases=tuple(cases), **top)
    if suite.style not in STYLES:
        raise SuiteError(f"{path}: style: must be one of {', '.join(STYLES)}, got {suite.style!r}")
    _validate_allocators(suite)
    return suite


def _validate_case(case: Case, where: str) -> None:
    if case.condition not in CONDITIONS:
        raise SuiteError(f"{where}.condition: {case.condition!r} is not one of {', '.join(CONDITIONS)}")
    for key in ("sessions", "rounds", "max_tokens"):
        if getattr(case, key) < 1:
            raise SuiteError(f"{where}.{key}: must be at least 1")
    if not 0 <= case.pressure_round < case.rounds:
        raise SuiteError(f"{where}.pressure_round: must be in 0..rounds-1")
    if case.style is not None and case.style not in STYLES:
        raise SuiteError(f"{where}.style: must be one of {', '.join(STYLES)}, got {case.style!r}")
    if case.start_range[0] > case.start_range[1]:
        raise SuiteError(f"{where}.start_range: the first value exceeds the second")


def _validate_allocators(suite: Suite) -> None:
    from reference_engine import allocators
    from reference_engine.errors import UnknownAllocatorError

    for i, case in enumerate(suite.cases):
        for name in case.allocators or suite.allocators:
            try:
                allocators.canonical_name(name)
            except UnknownAllocatorError as e:
                key = f"cases[{i}].allocators" if case.allocators else "allocators"
                raise SuiteError(f"{suite.path}: {key}: {e}") from None


def resolve_suite_path(path: str | Path) -> Path:
    """A file path, or the name of a bundled suite ("reproduce", "smoke", "weekly")."""
    p = Path(path)
    if p.is_file():
        return p
    bundled = SUITES / f"{path}.yaml"
    if bundled.is_file():
        return bundled
    raise SuiteError(f"{path}: no such suite file (bundled suites: "
                     f"{', '.join(sorted(q.stem for q in SUITES.glob('*.yaml')))})")


def with_overrides(case: Case, **kw) -> Case:
    return dataclasses.replace(case, **{k: v for k, v in kw.items() if v is not None})


def names(values: list[str] | str | None) -> list[str] | None:
    """A list option's values: repeated, comma-separated, or both. None when not given."""
    if not values:
        return None
    values = [values] if isinstance(values, str) else values
    out = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return out or None


def load_cases(suite: str | Path, cases: list[str] | str | None = None, style: str | None = None,
               *, one: bool = False) -> tuple[Suite, list[Case]]:
    """(suite, [cases]) with `style` applied: `cases` as `names` reads them, or None for the
    default cases; with `one`, the case named or the first default one. KvdiagError when
    nothing is selected."""
    loaded = load_suite(suite)
    if style:
        loaded = dataclasses.replace(loaded, style=style)
    spec = ",".join(names(cases) or []) or None
    if one:
        return loaded, [loaded.case(spec) if spec else (loaded.select(None) or list(loaded.cases))[0]]
    chosen = loaded.select(spec)
    if not chosen:
        raise KvdiagError(f"{loaded.path}: no case selected by {spec!r}")
    return loaded, chosen


__all__ = ["Case", "Suite", "field", "load_cases", "load_suite", "names", "resolve_suite_path",
           "with_overrides"]
