"""FLEET.yaml: the targets of a weekly fleet job and, per target, its suites, cases and a
concurrency limit. Everything is checked here, before Ray starts; a bad file raises one
KvdiagError line naming the file and the key (exit 2 through the CLI).

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
from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.errors import KvdiagError

ENDPOINT_CPUS, ENGINE_CPUS = 0.25, 1.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
TARGET_KEYS = {"name", "target", "model", "flags", "suites", "concurrency", "requests", "num_cpus",
               "api_key_env"}
TOP_KEYS = {"history", "baseline", "time_limit", "max_retries", "targets"}


@dataclass(frozen=True)
class Cell:
    """One (target, suite, case): one Ray task, one run directory, one history row."""

    target: str  # the fleet target's name
    suite: str  # the suite as given (a bundled name or a path)
    suite_name: str
    case: str

    @property
    def id(self) -> str:
        return f"{self.target}.{self.suite_name}.{self.case}"


@dataclass
class FleetTarget:
    name: str
    spec: str
    kind: str  # "url", "reference" or "vllm-local"
    model: str | None
    flags: dict
    suites: list[tuple[str, list[str]]]  # (suite as given, case names)
    concurrency: int = 1
    requests: int = 16
    num_cpus: float = ENDPOINT_CPUS
    api_key_env: str | None = None


@dataclass
class Fleet:
    path: Path
    targets: list[FleetTarget]
    cells: list[Cell]
    history: Path
    baseline: Path
    time_limit: float = 3600.0
    max_retries: int = 1
    by_name: dict = field(default_factory=dict)


def _num(value, where: str, kind=float, low=0.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or kind(value) != value \
            or value <= low:
        raise KvdiagError(f"{where}: expected a {'whole ' if kind is int else ''}number > {low:g}, "
                          f"got {value!r}")
    return kind(value)


def _suite_path(suite: str, base: Path) -> str:
    """A suite given as a path is relative to the fleet file; a bare name is a bundled suite."""
    near = base / suite
    return str(near.resolve()) if suite.endswith((".yaml", ".yml")) and near.is_file() else suite


def load_fleet(path: Path) -> Fleet:
    import yaml

    from kvdiag.regress import baselines as B
    from kvdiag.regress import history as H
    from kvdiag.suites import load_suite
    from kvdiag.targets import parse_target

    path = Path(path)
    if not path.is_file():
        raise KvdiagError(f"{path}: no such fleet file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise KvdiagError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("targets"), list) or not data["targets"]:
        raise KvdiagError(f"{path}: expected a mapping with a non-empty list `targets`")
    if unknown := set(data) - TOP_KEYS:
        raise KvdiagError(f"{path}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(TOP_KEYS))})")
    targets, cells, suites = [], [], {}
    for i, t in enumerate(data["targets"]):
        where = f"{path}: targets[{i}]"
        if not isinstance(t, dict):
            raise KvdiagError(f"{where}: expected a mapping")
        if unknown := set(t) - TARGET_KEYS:
            raise KvdiagError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        name = str(t.get("name", ""))
        if not NAME.match(name):
            raise KvdiagError(f"{where}.name: {name!r} is not a name (letters, digits, _ . -)")
        if any(x.name == name for x in targets):
            raise KvdiagError(f"{where}.name: duplicate target name {name!r}")
        try:
            target = parse_target(str(t.get("target", "")))
        except KvdiagError as e:
            raise KvdiagError(f"{where}.target: {e}") from None
        kind = "url" if target.url else ("reference" if target.is_reference else "vllm-local")
        if kind == "url" and not t.get("model"):
            raise KvdiagError(f"{where}.model: a URL target needs the served model name")
        flags = t.get("flags") or {}
        if not isinstance(flags, dict):
            raise KvdiagError(f"{where}.flags: expected a mapping NAME: VALUE")
        entries = t.get("suites")
        if not isinstance(entries, list) or not entries:
            raise KvdiagError(f"{where}.suites: expected a non-empty list")
        chosen = []
        for j, entry in enumerate(entries):
            entry = {"suite": entry} if isinstance(entry, str) else entry
            if not isinstance(entry, dict) or not isinstance(entry.get("suite"), str):
                raise KvdiagError(f"{where}.suites[{j}]: expected a suite name or {{suite: S, cases: [..]}}")
            given = _suite_path(entry["suite"], path.parent)
            if given not in suites:
                try:
                    suites[given] = load_suite(given)
                except (KvdiagError, FileNotFoundError, ValueError) as e:
                    raise KvdiagError(f"{where}.suites[{j}]: {str(e).splitlines()[0]}") from None
            suite = suites[given]
            cases = entry.get("cases")
            spec = ",".join(cases) if isinstance(cases, list) else cases
            try:
                picked = [c.name for c in suite.select(spec)]
            except (KvdiagError, ValueError) as e:
                raise KvdiagError(f"{where}.suites[{j}].cases: {str(e).splitlines()[0]}") from None
            chosen.append((given, picked))
            cells += [Cell(name, given, suite.name, c) for c in picked]
        cpus = ENDPOINT_CPUS if kind == "url" else ENGINE_CPUS
        targets.append(FleetTarget(
            name, target.spec, kind, t.get("model"), {str(k): str(v) for k, v in flags.items()}, chosen,
            concurrency=_num(t.get("concurrency", 1), f"{where}.concurrency", int),
            requests=_num(t.get("requests", 16), f"{where}.requests", int),
            num_cpus=_num(t.get("num_cpus", cpus), f"{where}.num_cpus"),
            api_key_env=t.get("api_key_env")))
    fleet = Fleet(path, targets, cells, Path(data.get("history") or H.DEFAULT_PATH),
                  Path(data.get("baseline") or B.DEFAULT_PATH),
                  time_limit=_num(data.get("time_limit", 3600), f"{path}: time_limit"),
                  max_retries=_num(data.get("max_retries", 1), f"{path}: max_retries", int, -1))
    fleet.by_name = {t.name: t for t in targets}
    return fleet
