"""ProbeArgs: everything a probe is asked, as one object from the CLI (or compare, detect) to
kvdiag.commands.probe.probe: what to send (suite, case, style, a sessions file), where
(a URL or a target kvdiag starts), how the phases run (ProbeSettings), what the run keeps.
The summary's traffic block (kvdiag.record.evidence.Traffic) records what of it reached the
server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.runners.live.phases import ProbeSettings


@dataclass(frozen=True)
class ProbeArgs:
    """suite, case, style      the traffic: a suite's case (one), in a style (canary, natural)
    sessions, sessions_format  a sessions file replayed instead of the suite's (kvdiag.userdata)
    base_url | target          a server's URL, or a *-local[:FAULT] target kvdiag starts
    model, api_key             the served model; the key (never written, never shown)
    settings                   the phases: kvdiag.runners.live.phases.ProbeSettings
    count_with                 tokenize or usage: how prompt tokens are counted while planning
    sentinel                   a sentinel's file, 'off', or None (on for a local engine with one)
    engine_args                flags for the server a local target starts ("FLAG VALUE" each)
    no_text                    no prompt or answer text in the run's files
    out_dir, resume            where the run goes; a run directory to continue"""

    suite: str = "reproduce"
    case: str | list[str] | None = None  # compare's --case is a list: it must hold one
    style: str | None = None
    sessions: Path | None = None
    sessions_format: str | None = None
    base_url: str | None = None
    target: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    settings: ProbeSettings = field(default_factory=ProbeSettings)
    count_with: str = "tokenize"
    sentinel: str | None = None
    engine_args: tuple[str, ...] = ()
    no_text: bool = False
    out_dir: Path | None = None
    resume: Path | None = None

    @property
    def engine_argv(self) -> tuple[str, ...]:
        """engine_args split into argv words ("-np 2" -> "-np", "2")."""
        return tuple(part for arg in self.engine_args for part in arg.split())
