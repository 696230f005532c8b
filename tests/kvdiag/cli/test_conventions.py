"""The CLI's conventions, as a newcomer meets them: --version alone works, bad options fail
at once (before any work), list options take one form, choices and examples are in every
help, and errors are one line."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app


def _leaves():
    import typer.main

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in sorted(command.commands.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    return list(walk(typer.main.get_command(app), []))


def test_version_alone():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("kvdiag ")


@pytest.mark.parametrize("args", [
    ["verify", "--expect-guard", "--allocator", "nosuch"],
    ["reproduce", "--suite", "smoke", "KVDIAG_ALLOCATOR_WORKERS=nosuch"],
    ["reproduce", "--allocator", "buggy,nosuch"],
    ["reproduce", "--allocator", "buggy", "--allocator", "nosuch"],
    ["reproduce", "--case", "trigger,nosuch"],
    ["regress", "--target", "reference:nosuch", "--suite", "smoke"],
    ["audit-vllm", "--compare", "nosuch"],
])
def test_bad_options_fail_before_any_work(args):
    """Before the fix these errors came after 80-90 s of measurement; an import of the
    suite and registry modules is all they may cost (warmed first, so a loaded machine's
    first import is not what is timed)."""
    CliRunner().invoke(app, ["reproduce", "--allocator", "nosuch"])
    env = dict(a.split("=", 1) for a in args if "=" in a)  # an environment setting, likewise
    start = time.monotonic()
    result = CliRunner().invoke(app, [a for a in args if "=" not in a], env=env)
    assert result.exit_code == 2, result.output
    assert time.monotonic() - start < 5, "validated only after work began"
    assert "nosuch" in result.output and "Traceback" not in result.output
    assert not result.output.startswith("\n")  # no stray blank line before the error
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args,named", [
    (["probe", "--base-url", "ftp://nosuch", "--model", "canary", "--suite", "smoke"], "not ftp"),
    (["isolation", "--base-url", "ftp://nosuch", "--model", "canary"], "not ftp"),
    (["probe", "--target", "vllm-local", "--suite", "smoke", "--sentinel", "/proc/nosuch/s.jsonl"],
     "--sentinel /proc/nosuch/s.jsonl"),  # a file a server kvdiag starts could not write
    (["probe", "--base-url", "http://127.0.0.1:9", "--model", "c", "--suite", "smoke",
      "--sentinel", "{tmp}/none.jsonl"], "No such file"),  # somebody else's server writes none
    (["serve", "--sentinel", "/proc/nosuch/s.jsonl"], "--sentinel /proc/nosuch/s.jsonl"),
    (["probe", "--base-url", "http://127.0.0.1:9", "--model", "c", "--suite", "{bad}"],
     ".block_size: Input should be greater than 0 (got -4)"),
    (["probe", "--base-url", "http://127.0.0.1:9", "--model", "c", "--suite", "{bad_rate}"],
     "cases[0].ask_new: Input should be less than or equal to 1"),
])
def test_bad_input_is_refused_at_the_door(tmp_path, args, named):
    """A URL that is not http(s), a suite number out of range: one line, the field or the
    scheme named, before any connection is tried (under 1 s, the imports warmed first)."""
    (tmp_path / "bad.yaml").write_text("name: bad\nblock_size: -4\ncases:\n  - name: trigger\n")
    (tmp_path / "rate.yaml").write_text("name: bad\ncases:\n  - name: trigger\n    ask_new: 1.5\n")
    args = [a.format(bad=tmp_path / "bad.yaml", bad_rate=tmp_path / "rate.yaml", tmp=tmp_path)
            for a in args]
    CliRunner().invoke(app, args)
    start = time.monotonic()
    result = CliRunner().invoke(app, args)
    assert time.monotonic() - start < 1.0
    assert result.exit_code == 2 and named in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("path,command", _leaves(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_help_shows_choices_and_ends_with_an_example(path, command):
    text = " ".join((command.help or "").split())
    assert "Example: kvdiag" in text or "Example: .venv" in text, f"{path}: no example in --help"
    shown = " ".join(CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output.split())
    choices = {"device": ("cpu|cuda",), "dtype": ("float32|bfloat16|float16", "bfloat16|float32"),
               "style": ("canary|natural",)}
    for param in command.params:
        name = getattr(param, "name", "")
        if name in choices:
            assert any(c in shown for c in choices[name]), f"{path} --{name} shows no choices"
        if name == "allocator" and param.help:
            assert "guarded" in param.help and "stale-hash" in param.help

def test_list_options_take_one_form():
    """--case (and reproduce's --allocator) repeat, or take commas, everywhere."""
    for path, command in _leaves():
        for param in command.params:
            if getattr(param, "name", "") == "case" and path[0] not in ("verify", "probe", "audit-vllm", "isolation", "detect"):
                assert param.multiple, f"{path} --case is not repeatable"


def test_exporter_binds_loopback_by_default():
    (command,) = [c for p, c in _leaves() if p == ["exporter"]]
    (addr,) = [p for p in command.params if p.name == "addr"]
    assert addr.default == "127.0.0.1"
