"""The command that reruns a run, as summary.json records it: rebuilt from the running CLI
command's parsed options, with every secret (API keys, tokens) redacted."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

SECRET_PARAMS = re.compile(r"(api[_-]?key|token|secret|password)", re.IGNORECASE)
REDACTED = "***"


def redact(words: list[str], secret_flags: set[str]) -> list[str]:
    """The words of a command line with the value of every secret flag replaced."""
    out, hide = [], False
    for w in words:
        flag, eq, _ = w.partition("=")
        if hide:
            out.append(REDACTED)
            hide = False
        elif flag in secret_flags and eq:
            out.append(f"{flag}={REDACTED}")
        else:
            hide = w in secret_flags
            out.append(w)
    return out


def command_line() -> str:
    """The command that reruns this run, rebuilt from the running CLI command's parsed
    options (so it reads the same from a shell, a test runner or a subprocess). Secrets
    (API keys, tokens) are never recorded: their values read ***."""
    ctx = _click_context()
    if ctx is None:
        words = [Path(sys.argv[0]).name if sys.argv else "kvdiag", *sys.argv[1:]]
        flags = {w.partition("=")[0] for w in words if w.startswith("--") and SECRET_PARAMS.search(w)}
        return shlex.join(redact(words, flags))
    words = ["kvdiag", *_command_path(ctx)]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value == param.default or not param.opts:
            if param.param_type_name == "argument" and value is not None:
                words.append(str(value))
            continue
        flag = max(param.opts, key=len)
        secret = SECRET_PARAMS.search(param.name or "")
        if isinstance(value, bool):
            if value:
                words.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                words += [flag, REDACTED if secret else str(v)]
        else:
            words += [flag, REDACTED if secret else str(value)]
    return shlex.join(words)


def _click_context():
    """The running command's click context, or None. Typer 0.2x runs on its own copy of
    click (typer._click), whose context stack plain click cannot see: ask both."""
    import importlib

    for name in ("typer._click.globals", "click.globals"):
        try:
            ctx = importlib.import_module(name).get_current_context(silent=True)
        except ImportError:
            continue
        if ctx is not None:
            return ctx
    return None


def _command_path(ctx) -> list[str]:
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return names[::-1]
