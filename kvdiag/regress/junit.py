"""JUnit XML for CI systems: one <testsuite> per regression run, one <testcase> per case and
metric, a <failure> naming every regressed round, and one <testcase> for the run's own
ground truth, which carries its verdict:

    pass          the testcase passes
    fail          <failure>
    inconclusive  <skipped message="REASON">: the run proved nothing, which is neither a pass
                  (nothing was shown to hold) nor a failure (nothing was shown broken); CI
                  systems count and show skips, so an inconclusive run never reads green
    error         <error>: the ground truth itself is unsound"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdiag.regress.compare import Check


def junit_xml(suite: str, target: str, checks: Sequence[Check], *, seconds: float = 0.0,
              properties: dict | None = None, error: str | None = None,
              ground_truth: tuple | None = None, case: str = "run") -> bytes:
    """`checks`: kvdiag.regress.compare.Check. `error` (a key mismatch, a failed run) becomes one
    <testcase> with an <error>. `ground_truth`: (Verdict, reason) of the run's own check,
    reported as the testcase "CASE/ground_truth" (`case`: the run's main case)."""
    import xml.etree.ElementTree as ET

    groups: dict[tuple[str, str], list[Check]] = {}
    for c in checks:
        groups.setdefault((c.case, c.metric), []).append(c)
    truth = ground_truth[0].value if ground_truth else None
    failed = sum(1 for rows in groups.values() if not all(r.passed for r in rows))
    failed += truth == "fail"
    errors = int(bool(error)) + (truth == "error")
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=f"kvdiag.regress.{suite}",
                       tests=str(len(groups) + (1 if error else 0) + (1 if truth else 0)),
                       failures=str(failed), errors=str(errors),
                       skipped=str(int(truth == "inconclusive")), time=f"{seconds:.2f}")
    if properties:
        props = ET.SubElement(ts, "properties")
        for name, value in properties.items():
            ET.SubElement(props, "property", name=str(name), value=str(value))
    classname = f"kvdiag.{suite}.{target}"
    if error:
        tc = ET.SubElement(ts, "testcase", classname=classname, name="baseline key", time="0")
        ET.SubElement(tc, "error", message=error.splitlines()[0][:500], type="KeyMismatch").text = error
    if truth:
        tc = ET.SubElement(ts, "testcase", classname=classname, name=f"{case}/ground_truth", time="0")
        reason = ground_truth[1]
        tag = {"fail": "failure", "inconclusive": "skipped", "error": "error"}.get(truth)
        if tag:
            ET.SubElement(tc, tag, message=f"{truth}: {reason}"[:500], type=truth).text = reason
    for (case, metric), rows in groups.items():
        tc = ET.SubElement(ts, "testcase", classname=classname, name=f"{case}/{metric}", time="0")
        bad = [r for r in rows if not r.passed]
        if bad:
            rounds = sorted({r.round for r in bad if r.round is not None})
            where = f"rounds {rounds}" if rounds else "whole run"
            ET.SubElement(tc, "failure", message=f"{metric} regressed in {case}: {where}",
                          type="Regression").text = "\n".join(r.message for r in bad)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(path: Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path
