"""`kvdiag --help` stays instant (no heavy import at start-up) and every command explains
its options."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

HEAVY = ("torch", "pandas", "spacy", "matplotlib", "transformers", "sacrebleu", "vllm", "fastapi")


def test_help_imports_nothing_heavy():
    code = ("import sys; from kvdiag.cli import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _commands():
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands.items())


@pytest.mark.parametrize("name,command", _commands())
def test_every_command_explains_its_options(name, command):
    import click

    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert (command.help or "").strip(), f"{name} has no description"
    if isinstance(command, click.Group):
        for sub in command.commands:
            assert CliRunner().invoke(app, [name, sub, "--help"]).exit_code == 0
        return
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert (param.help or "").strip(), f"{name} {param.opts[0]} has no help text"


def test_probe_help_groups_its_options_in_panels():
    """probe's options under five panels (target, traffic, phases, judging, output), each
    option in one of them, shared option aliases left as other commands show them."""
    import typer.main

    group = typer.main.get_command(app)
    panels = {p.name: p.rich_help_panel for p in group.commands["probe"].params if p.name != "help"}
    assert set(panels.values()) == {"Target", "Traffic", "Phases", "Judging", "Output"}, panels
    assert panels["base_url"] == "Target" and panels["lifecycle"] == "Phases"
    assert panels["numerics_margin"] == "Judging" and panels["out_dir"] == "Output"
    shown = CliRunner().invoke(app, ["probe", "--help"], env={"COLUMNS": "200"}).output
    assert all(f"─ {name} " in shown for name in set(panels.values())), shown[:2000]
    # the --base-url alias is shared: compare's stays outside probe's panel
    assert {p.rich_help_panel for p in group.commands["isolation"].params if p.name == "base_url"} == {None}


def test_an_option_left_out_of_every_panel_is_refused():
    from typing import Annotated

    import typer

    from kvdiag.cli.common import help_panels

    def command(a: Annotated[int, typer.Option("--a")] = 1, b: Annotated[int, typer.Option("--b")] = 2):
        return a + b

    with pytest.raises(TypeError, match=r"options in no help panel: \['b'\]"):
        help_panels(One=("a",))(command)
