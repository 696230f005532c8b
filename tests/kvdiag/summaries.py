"""Typed summaries for the renderers' tests: each kind's model with what a test does not care
about filled in, so a test names only the fields it checks (the renderers take these models,
never dicts: kvdiag.record.summary)."""

from __future__ import annotations

from kvdiag.record.summary import (
    CompareSummary,
    IsolationSummary,
    MatrixSummary,
    ReproduceSummary,
)

SIGNATURE = ("kvdiag:0.1|engine:reference|alloc:buggy,guarded|bs:16|model:canary-0123abcd|"
             "suite:reproduce|seed:0")


def reproduce(**fields) -> ReproduceSummary:
    base = {"signature": SIGNATURE, "suite": "reproduce", "verdict": "pass",
            "suite_path": "suites/reproduce.yaml", "cases": [], "targets": [], "allocators": [],
            "model": "canary-0123abcd", "device": "cpu", "engine_log": {}, "seconds": {},
            "gates": {}, "faults": {}}
    return ReproduceSummary(**(base | fields))


def isolation(**fields) -> IsolationSummary:
    base = {"signature": SIGNATURE, "suite": "isolation", "verdict": "pass", "target": "http://x",
            "model": "canary", "requests": 0, "leaks": [], "isolation": {}}
    return IsolationSummary(**(base | fields))


def matrix(**fields) -> MatrixSummary:
    base = {"signature": SIGNATURE, "suite": "smoke", "verdict": "pass", "engine": "vllm",
            "paths": ["audit"], "matrix": []}
    return MatrixSummary(**(base | fields))


def compare(**fields) -> CompareSummary:
    base = {"signature": SIGNATURE, "suite": "smoke", "verdict": "pass", "targets": []}
    return CompareSummary(**(base | fields))
