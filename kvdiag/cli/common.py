"""What every command shares: option aliases and option groups (each defined once) and the
error boundary that turns bad input into one line and exit code 2 (docs/architecture.md: 0 pass,
1 check failed, 2 the run could not be made). Output and progress live in
kvdiag.report.console, beside the renderers."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from pathlib import Path
from typing import Annotated, Literal, get_args, get_type_hints

import typer

from kvdiag.errors import KvdiagError
from kvdiag.paths import CANARY
from kvdiag.report.console import Output, enable_engine_log  # noqa: F401  (what commands use)
from reference_engine.errors import EngineError, IntegrityError

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
DEFAULT_MODEL, DEFAULT_HISTORY = CANARY, Path("reports/history.sqlite")

ModelOpt = Annotated[Path | None, typer.Option(
    "--model", show_default=False, help="Local Hugging Face model directory (Qwen2, Qwen3 or "
    "Llama). Default: the suite's model, else the bundled canary.")]
DeviceOpt = Annotated[Literal["cpu", "cuda"], typer.Option("--device", help="Where the reference "
                                                          "engine runs.")]
DtypeOpt = Annotated[Literal["float32", "bfloat16", "float16"] | None, typer.Option(
    "--dtype", show_default=False, help="Weights and KV dtype. Default: float32 on CPU, bfloat16 "
    "on CUDA.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
AllocatorOpt = Annotated[str, typer.Option(
    "--allocator", help="Block allocator: prefix-cache, stale-hash (alias buggy), stale-bytes, "
    "unchained-hash, salt-collision, guarded, or guarded:NAME (the guard around NAME).")]
SuiteOpt = Annotated[str, typer.Option("--suite", help="Suite YAML file, or the name of a bundled "
                                       "suite: reproduce, smoke, weekly.")]
CaseOpt = Annotated[list[str] | None, typer.Option(
    "--case", show_default=False, help="Case to run; repeat it or separate names by commas; 'all' "
    "or 'ablations' select groups. Default: the suite's default cases.")]
OneCaseOpt = Annotated[str | None, typer.Option(
    "--case", show_default=False, help="Case to run. Default: the suite's first default case.")]
StyleOpt = Annotated[Literal["canary", "natural"] | None, typer.Option(
    "--style", show_default=False, help="Session style: canary (the canary model's fact lines) or "
    "natural (English, for real chat models). Default: the suite's.")]
OutOpt = Annotated[Path | None, typer.Option(
    "--out", show_default=False, help="New run directory (refused if it exists and is not "
    "empty). Default: reports/NAME-TIME.")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="OPENAI_API_KEY", show_default=False,
    help="Bearer token for the server (never written to disk or reports).")]
HistoryOpt = Annotated[Path, typer.Option("--history", help="Run history (SQLite) that kvdiag "
                                          "regress appends to.")]
NoCacheOpt = Annotated[bool, typer.Option(
    "--no-reference-cache", help="Recompute the contiguous reference instead of reading it from "
    "the on-disk cache (keyed by prompts, weights, engine source, torch and settings).")]
CheckIntegrityOpt = Annotated[bool, typer.Option(
    "--check-integrity", help="Check every allocator invariant after every engine step (slow; "
    "a stale hash entry raises at once, naming block and generation).")]
TargetModelOpt = Annotated[str | None, typer.Option(
    "--model", show_default=False, help="The model name as the server serves it (required for a "
    "URL); for a target kvdiag runs itself (reference, vllm-local): a local model directory "
    "(default: the suite's, else the canary).")]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", min=1, help="Live servers: requests "
                                             "in flight at once.")]
ResumeOpt = Annotated[Path | None, typer.Option(
    "--resume", show_default=False, help="An interrupted run's directory: finish what it left.")]
SuiteFilterOpt = Annotated[str | None, typer.Option("--suite", help="Only this suite's runs.")]
BaseUrlOpt = Annotated[str | None, typer.Option(
    "--base-url", show_default=False, help="The server, e.g. http://127.0.0.1:8000 (with or "
    "without /v1); only this endpoint gets traffic.")]
BlockSizeOpt = Annotated[int | None, typer.Option(
    "--block-size", min=1, show_default=False, help="The server's KV block size, where its /metrics "
    "has no vllm:cache_config_info (else: the suite's, or 16 without a suite).")]
SessionsOpt = Annotated[Path | None, typer.Option(
    "--sessions", show_default=False, help="Replay your own conversations instead of generated "
    "ones: JSONL, one a line, or one JSON array, in OpenAI chat or ShareGPT format "
    "(docs/own-sessions.md); the suite's case says how many and at most how many rounds.")]
SessionsFormatOpt = Annotated[Literal["auto", "openai", "sharegpt"], typer.Option(
    "--sessions-format", help="The sessions file's format; auto: told by its first conversation.")]
NoTextOpt = Annotated[bool, typer.Option(
    "--no-text", help="Keep no prompt or answer text in results, summary and page: token counts, "
    "metrics and hashes only.")]


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """An option group: the options of every suite run through the reference engine
    (reproduce, verify). A command takes them as one parameter (see option_groups)."""

    model: ModelOpt = None
    device: DeviceOpt = "cpu"
    dtype: DtypeOpt = None
    out_dir: OutOpt = None
    check_integrity: CheckIntegrityOpt = False
    no_reference_cache: NoCacheOpt = False

    def pipeline_args(self) -> dict:
        """As kvdiag.commands.reproduce.reproduce takes them."""
        args = dataclasses.asdict(self)
        args["use_cache"] = not args.pop("no_reference_cache")
        return args


def option_groups(command):
    """Decorator: a parameter of `command` annotated with an option group (a dataclass of
    options, such as EngineRun) stands for the group's options, in its place; the command
    gets them back as one instance of the group."""
    hints = get_type_hints(command, include_extras=True)
    params, groups = [], {}
    for param in inspect.signature(command).parameters.values():
        kind = hints[param.name]
        if not dataclasses.is_dataclass(kind):
            params.append(param.replace(annotation=kind))
            continue
        groups[param.name] = kind
        fields = get_type_hints(kind, include_extras=True)
        params += [param.replace(name=f.name, annotation=fields[f.name], default=f.default)
                   for f in dataclasses.fields(kind)]

    @functools.wraps(command)
    def wrapper(**options):
        for name, kind in groups.items():
            options[name] = kind(**{f.name: options.pop(f.name) for f in dataclasses.fields(kind)})
        return command(**options)

    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def _in_panel(option, panel: str):
    """A copy of a typer option shown under `panel` (an option alias like BaseUrlOpt is shared
    between commands: it is copied, not changed)."""
    option = copy.copy(option)
    option.rich_help_panel = panel
    return option


def help_panels(**panels: tuple[str, ...]):
    """Decorator: `--help` shows each option under its panel (panel name -> parameter names;
    underscores in a panel's name are spaces). Every parameter is in one panel, so an option
    added later cannot fall outside them unseen."""
    def wrap(command):
        hints = get_type_hints(command, include_extras=True)
        where = {name: panel.replace("_", " ") for panel, names in panels.items() for name in names}
        params = list(inspect.signature(command).parameters.values())
        if missing := [p.name for p in params if p.name not in where]:
            raise TypeError(f"{command.__name__}: options in no help panel: {missing}")
        out = []
        for param in params:
            base, *meta = get_args(hints[param.name])
            meta = [_in_panel(m, where[param.name]) if isinstance(m, typer.models.OptionInfo)
                    else m for m in meta]
            out.append(param.replace(annotation=Annotated[(base, *meta)]))
        command.__signature__ = inspect.Signature(out)
        command.__annotations__ = {p.name: p.annotation for p in out}
        return command
    return wrap


def handle_errors(fn):
    """Decorator: kvdiag's own errors (bad input: suite, target, endpoint, run directory,
    options; the engine's input errors) become one line on stderr and exit 2, never a
    traceback. Every other exception is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (EngineError, KvdiagError) as e:
            Output().error(str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            Output().error("interrupted")
            raise typer.Exit(EXIT_ERROR) from None
        except IntegrityError as e:  # --check-integrity caught the engine corrupting its cache
            Output().error(f"integrity check failed: {e}")
            raise typer.Exit(EXIT_FAIL) from None

    return wrapper
