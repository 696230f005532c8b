"""FLEET.yaml: the targets of a weekly fleet job and, per target, its suites, cases and a
concurrency limit. Everything is checked here, before Ray starts: the file's shape by pydantic
(strict, no unknown key), then targets, suites and cases; a bad file raises one KvdiagError
line naming the file and the key (exit 2 through the CLI).

    history: reports/history.sqlite       # optional (default shown); relative to the cwd
    baseline: reports/baselines.json      # optional
    time_limit: 1800                      # seconds per cell (one Ray task); default 3600
    max_retries: 1                        # Ray retries of a cell whose worker died
    targets:
      - name: gpu-01                      # unique; names the cell directories
        target: http://gpu-01:8000        # a URL, reference:ALLOCATOR or vllm-local[:FAULT]
        model: Qwen/Qwen3-8B              # URL targets: the served name (required)
        flags: {tp: 2}                    # extra baseline key flags
        api_key_env: GPU01_API_KEY        # the driver's environment variable holding its key
        suites: [{suite: weekly, cases: [natural]}]   # or plain names: [smoke]
        concurrency: 1                    # cells of this target at once (default 1)
        requests: 16                      # URL targets: requests in flight within a cell
        num_cpus: 0.25                    # Ray resources of a cell (default: 0.25 for URLs,
                                          # 1 for the reference engine)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from kvdiag.errors import KvdiagError

ENDPOINT_CPUS, ENGINE_CPUS = 0.25, 1.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(f"{value!r} is not a name (letters, digits, _ . -)")
    return value


def _suite_entry(value):
    """A plain suite name is {suite: NAME}."""
    if isinstance(value, str):
        return {"suite": value}
    if not isinstance(value, dict):
        raise ValueError("expected a suite name or {suite: S, cases: [..]}")
    return value


# --- the file, as written: pydantic in strict mode (no "1" for 1, no true for 1), no unknown key
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class SuiteEntry(_Strict):
    suite: str
    cases: list[str] | str | None = None  # None: the suite's default cases


class TargetEntry(_Strict):
    name: Annotated[str, AfterValidator(_name)]
    target: str  # a URL, reference:ALLOCATOR, vllm-local[:FAULT] or sglang-local[:FAULT]
    model: str | None = None
    flags: dict[Any, Any] | None = None
    api_key_env: str | None = None
    suites: Annotated[list[Annotated[SuiteEntry, BeforeValidator(_suite_entry)]], Field(min_length=1)]
    concurrency: Annotated[int, Field(gt=0)] = 1
    requests: Annotated[int, Field(gt=0)] = 16
    num_cpus: Annotated[float, Field(gt=0)] | None = None  # None: by the target's kind


class FleetFile(_Strict):
    history: str | None = None
    baseline: str | None = None
    time_limit: Annotated[float, Field(gt=0)] = 3600.0
    max_retries: Annotated[int, Field(ge=0)] = 1
    targets: Annotated[list[TargetEntry], Field(min_length=1)]


# --- what it resolves to
class Cell(BaseModel):
    """One (target, suite, case): one Ray task, one run directory, one history row."""

    model_config = ConfigDict(frozen=True)
    target: str  # the fleet target's name
    suite: str  # the suite as given (a bundled name or a path)
    suite_name: str
    case: str

    @property
    def id(self) -> str:
        return f"{self.target}.{self.suite_name}.{self.case}"


class FleetTarget(BaseModel):
    name: str
    spec: str
    kind: str  # "url", "reference" or its engine's "<engine>-local" (targets.Target.kind)
    model: str | None
    flags: dict[str, str]
    suites: list[tuple[str, list[str]]]  # (suite as given, case names)
    concurrency: int = 1
    requests: int = 16
    num_cpus: float = ENDPOINT_CPUS
    api_key_env: str | None = None

    @property
    def is_local(self) -> bool:
        """A local engine's: its server runs on the driver's machine, so its cells run there."""
        return self.kind not in ("url", "reference")


class Fleet(BaseModel):
    path: Path
    targets: list[FleetTarget]
    cells: list[Cell]
    history: Path
    baseline: Path
    time_limit: float = 3600.0
    max_retries: int = 1

    @property
    def by_name(self) -> dict[str, FleetTarget]:
        return {t.name: t for t in self.targets}


def _first_error(e: ValidationError) -> str:
    """`targets[0].concurrency: Input should be greater than 0 (got 0)` from pydantic's first."""
    first = e.errors()[0]
    where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first["loc"]).lstrip(".")
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key"
    if kind == "value_error":  # our own validators' words, which name the value
        return f"{where}: {first['msg'].removeprefix('Value error, ')}"
    message = "expected a mapping" if kind in ("model_type", "dict_type") else first["msg"]
    return f"{where}: {message}" + ("" if kind == "missing" else f" (got {first['input']!r})")


def _suite_path(suite: str, base: Path) -> str:
    """A suite given as a path is relative to the fleet file; a bare name is a bundled suite."""
    near = base / suite
    return str(near.resolve()) if suite.endswith((".yaml", ".yml")) and near.is_file() else suite


def load_fleet(path: Path) -> Fleet:
    import yaml

    from kvdiag.planning.suites import load_suite
    from kvdiag.regress import baselines as B
    from kvdiag.regress import history as H
    from kvdiag.targets import parse_target

    path = Path(path)
    if not path.is_file():
        raise KvdiagError(f"{path}: no such fleet file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise KvdiagError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise KvdiagError(f"{path}: expected a mapping with a non-empty list `targets`")
    try:
        file = FleetFile.model_validate(data)
    except ValidationError as e:
        raise KvdiagError(f"{path}: {_first_error(e)}") from None
    targets, cells, suites = [], [], {}
    for i, t in enumerate(file.targets):
        where = f"{path}: targets[{i}]"
        if any(x.name == t.name for x in targets):
            raise KvdiagError(f"{where}.name: duplicate target name {t.name!r}")
        try:
            target = parse_target(t.target)
        except KvdiagError as e:
            raise KvdiagError(f"{where}.target: {e}") from None
        kind = target.kind
        if kind == "url" and not t.model:
            raise KvdiagError(f"{where}.model: a URL target needs the served model name")
        chosen = []
        for j, entry in enumerate(t.suites):
            given = _suite_path(entry.suite, path.parent)
            if given not in suites:
                try:
                    suites[given] = load_suite(given)
                except (KvdiagError, FileNotFoundError, ValueError) as e:
                    raise KvdiagError(f"{where}.suites[{j}]: {str(e).splitlines()[0]}") from None
            suite = suites[given]
            spec = ",".join(entry.cases) if isinstance(entry.cases, list) else entry.cases
            try:
                picked = [c.name for c in suite.select(spec)]
            except (KvdiagError, ValueError) as e:
                raise KvdiagError(f"{where}.suites[{j}].cases: {str(e).splitlines()[0]}") from None
            chosen.append((given, picked))
            cells += [Cell(target=t.name, suite=given, suite_name=suite.name, case=c) for c in picked]
        default_cpus = ENDPOINT_CPUS if kind == "url" else ENGINE_CPUS
        targets.append(FleetTarget(
            name=t.name, spec=target.spec, kind=kind, model=t.model,
            flags={str(k): str(v) for k, v in (t.flags or {}).items()}, suites=chosen,
            concurrency=t.concurrency, requests=t.requests,
            num_cpus=default_cpus if t.num_cpus is None else t.num_cpus, api_key_env=t.api_key_env))
    return Fleet(path=path, targets=targets, cells=cells, history=Path(file.history or H.DEFAULT_PATH),
                 baseline=Path(file.baseline or B.DEFAULT_PATH), time_limit=file.time_limit,
                 max_retries=file.max_retries)
