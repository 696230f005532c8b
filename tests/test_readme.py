"""The README stays a first screen and stays true: at most 150 lines, the two make commands
first (a project contract), every `kvdiag SUBCOMMAND --option` it shows in code names a real
command and real options of the CLI, and every relative link points at a file (and heading)
that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"(?<![\w-])kvdiag[ \t]+(.*)")  # not kvdiag/..., kvdiag_..., kvdiag:...


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _code() -> list[str]:
    """Every command line the README shows: fenced blocks line by line (continuations joined,
    comments dropped) and inline code spans outside them."""
    text = _text()
    lines = []
    for block in FENCE.findall(text):
        lines += [line.split(" #", 1)[0] for line in block.replace("\\\n", " ").splitlines()]
    for _, span in INLINE.findall(FENCE.sub("", text)):
        lines.append(" ".join(span.split()))
    return lines


def _cli():
    import typer.main

    from kvdiag.cli import app

    return typer.main.get_command(app)


def _opts(command) -> set[str]:
    opts = {"--help", "-h"}
    for param in command.params:
        opts.update(getattr(param, "opts", ()))
        opts.update(getattr(param, "secondary_opts", ()))
    return opts


def _invocations() -> list[tuple[str, list[str], list[str]]]:
    """(the text, the command path, the options it uses) for every `kvdiag ...` in code."""
    found = []
    for line in _code():
        for piece in re.split(r"&&|;|\s\|\s", line):
            match = COMMAND.search(piece)
            if not match:
                continue
            words = [w.strip("[](),") for w in match.group(1).split()]
            path, rest = [], words
            while rest and not rest[0].startswith("-") and re.fullmatch(r"[a-z][a-z0-9-]*", rest[0]):
                path.append(rest[0])
                rest = rest[1:]
            options = [w.split("=", 1)[0] for w in rest if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", w)]
            found.append((piece.strip(), path, options))
    return found


def test_readme_is_short_and_starts_with_the_two_make_commands():
    text = _text()
    assert len(text.splitlines()) <= MAX_LINES
    head = text.split("\n```", 1)
    assert head[0].startswith("# ") and "\n" not in head[0].strip(), "only the title before the commands"
    first_block = FENCE.search(text).group(1).splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "reproduce"], ["make", "test"]]


def test_the_readme_shows_its_three_jobs():
    shown = {tuple(path) for _, path, _ in _invocations()}
    assert {("reproduce",), ("probe",), ("regress",)} <= shown


@pytest.mark.parametrize("text,path,options", [pytest.param(*i, id=i[0]) for i in _invocations()])
def test_every_kvdiag_command_in_the_readme_exists(text, path, options):
    command = _cli()
    walked = []
    for name in path:
        subs = getattr(command, "commands", None)
        if subs is None:
            break  # a leaf: the rest are its arguments (RUN_DIR, FLEET.yaml, ...)
        assert name in subs, f"{text!r}: no command `kvdiag {' '.join([*walked, name])}`"
        command = subs[name]
        walked.append(name)
    runs_alone = getattr(command, "invoke_without_command", False)  # kvdiag watch --upstream
    assert not (walked and hasattr(command, "commands") and not runs_alone), \
        f"{text!r}: `kvdiag {' '.join(walked)}` is a group: name one of its commands"
    unknown = [o for o in options if o not in _opts(command)]
    assert not unknown, f"{text!r}: `kvdiag {' '.join(walked)}` has no option {', '.join(unknown)}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (lowercase, punctuation dropped, spaces to
    hyphens, repeats numbered), plus explicit <a name=...> anchors."""
    anchors, seen = set(), {}
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    anchors.update(re.findall(r"<a name=\"([^\"]+)\"", text))
    return anchors


def test_every_relative_link_in_the_readme_exists():
    links = LINK.findall(FENCE.sub("", _text()))
    assert links
    for link in links:
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (README.parent / target) if target else README
        assert path.exists(), f"{link}: {target} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{link}: no heading #{anchor} in {target or 'README.md'}"
