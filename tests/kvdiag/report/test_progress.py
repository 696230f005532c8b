"""The one progress display (kvdiag.report.console.Progress): on a terminal a bar that follows
every update, elsewhere a plain line now and then; an update sets what it names and keeps the
rest (None: unchanged), `advance` adds to what was completed."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kvdiag.report.console import Output, ProgressState

pytestmark = pytest.mark.unit


def _output(terminal: bool) -> tuple[Output, io.StringIO]:
    out, buffer = Output(), io.StringIO()
    out.err = Console(file=buffer, force_terminal=terminal, width=100)
    return out, buffer


def test_an_update_sets_what_it_names_and_advance_adds():
    out, buffer = _output(terminal=False)
    progress = out.progress("probe", total=None)
    progress.every = 0.0  # a line on every update
    with progress as update:
        update(description="shared", completed=2, total=10)
        update(advance=3)
        update(total=None, description=None)  # None: unchanged
    assert progress.state == ProgressState("shared", 5, 10)
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("shared: 2/10 (") and lines[-1].startswith("shared: 5/10 (")


def test_a_terminal_bar_follows_the_state():
    out, _ = _output(terminal=True)
    progress = out.progress("reproduce", total=4)
    with progress as update:
        update(advance=1)
        update(description="case trigger")
        task = progress.bar.tasks[0]
        assert (task.description, task.completed, task.total) == ("case trigger", 1, 4)
