"""What a sentinel inside the server (kvdiag.sentinel) saw while a probe ran: its file read
from where the run began, every finding named by the probe's own request (the X-Request-Id
each request went out under is in the engine's request id), and the bad reads of each shared
request put into the round table's foreign_slots and unwritten_slots, the reference engine's
columns, and its attention_leakage where the sentinel weighed attention (a request that read
nothing wrong leaked exactly 0; one that did, its mass per sampled token), for a run in which
every wrong read was weighed (else every row is NaN: unmeasured, never partly). Raw counts
only: the judge decides."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.record.sentinel import SentinelBlock, SentinelFinding, SentinelRound
from kvdiag.runners.live import phases as P
from kvdiag.sentinel.log import read_report

TAG = re.compile(r"kvdiag-[0-9a-f]{16}")
FLUSH = 0.8  # seconds: longer than the sentinel's counters interval (kvdiag.sentinel.log)
SHOWN = 20  # findings kept in summary.json (all of them stay in the sentinel's file)


def _names(store) -> dict[str, tuple[str, int, int]]:
    if store is None:
        return {}
    return {row["request_id"]: key for key, row in store.done.items() if row.get("request_id")}


def _where(rid: str, names: dict) -> tuple[str, int, int] | None:
    m = TAG.search(rid)
    return names.get(m.group(0)) if m else None


def _label(key) -> str | None:
    if key is None:
        return None
    phase, session, rnd = key
    return f"{phase} session {session} round {rnd}"


def observe(source: str | Path, since: int = 0, store=None,
            wait: float = FLUSH) -> tuple[SentinelBlock, dict]:
    """The sentinel's block for this run, and the bad reads of each of the run's requests:
    (phase, session, round) -> {"foreign_slots", "unwritten_slots"[, "attention_leakage"]}
    (none without `store`).
    KvdiagError when its file is not there (a server started without the sentinel writes
    none). `wait`: for the server's last counters, written once its work stopped."""
    time.sleep(wait)
    try:
        report = read_report(source, since)
    except FileNotFoundError:
        raise KvdiagError(f"no sentinel file at {source} (was the server started with kvdiag's "
                          "plugin and KVDIAG_SENTINEL? docs/sentinel.md)") from None
    except OSError as e:  # a URL that stopped answering
        raise KvdiagError(f"sentinel at {source}: {e}") from None
    names = _names(store)
    findings, per_round, per_request, by_phase = [], {}, {}, {}
    for row in report.findings:
        key = _where(row["request"], names)
        writers = row.get("writers", [])
        findings.append(SentinelFinding(
            **{k: row[k] for k in ("kind", "step", "request", "positions", "count", "context_len")},
            where=_label(key), index=None if key is None else store.done[key].get("index"),
            writers=writers,
            writers_where=[_label(_where(w, names)) for w in writers],
            context=row.get("context", []), writer_context=row.get("writer_context", [])))
        if row["kind"] == "overwrite":
            continue
        phase = "unnamed" if key is None else key[0]
        by_phase[phase] = by_phase.get(phase, 0) + row["count"]
        if key is None:
            continue
        counts = per_request.setdefault(key, {"foreign_slots": 0, "unwritten_slots": 0})
        counts[f"{row['kind']}_slots"] += row["count"]
        if key[0] in (P.SHARED, P.PRESSURE):
            r = per_round.setdefault(key[2] + 1, {"requests": set(), "bad": 0, "share": 0.0})
            r["requests"].add(key[:2])
            r["bad"] += row["count"]
            r["share"] = max(r["share"], row["count"] / max(1, row["context_len"]))
    head = report.starts[0] if report.starts else {}
    c = report.counters
    # a run's leakage is measured only where every wrong read was weighed: a round's mean over
    # the rest would read as less than it was (the unweighed are the requests that read wrong)
    unweighed = sum(1 for row in report.leakage.values() if row["unmeasured"])
    weighed = bool(report.starts) and all(s.get("attention") for s in report.starts) and not unweighed
    if weighed and not c.unchecked:
        _leakage(report.leakage, names, per_request)
    block = SentinelBlock(
        source=str(source), engine=head.get("engine"), version=head.get("version"),
        starts=len(report.starts), steps=c.steps, requests=c.requests, reads=c.reads,
        writes=c.writes, unchecked=c.unchecked, foreign=c.foreign, unwritten=c.unwritten,
        overwrite=c.overwrite, groups=group_names(head.get("groups")), zeroed=c.zeroed, copies=c.copies,
        shifted=c.shifted,
        findings=findings[:SHOWN], findings_total=len(findings), attention=weighed,
        by_phase=dict(sorted(by_phase.items(), key=lambda kv: -kv[1])),
        isolated_bad=sum(n for phase, n in by_phase.items() if P.isolated(phase)),
        **({"trusts": head["trusts"]} if head.get("trusts") else {}),  # the engine's own account
        unseen=sorted({u for s in report.starts for u in s.get("unseen") or ()}),
        leaked=len(report.leakage), leakage_unweighed=unweighed, leakage_largest=max(
            (leak for row in report.leakage.values() if (leak := _leak(row)) == leak), default=None),
        rounds=[SentinelRound(round=r, requests=len(v["requests"]), bad_reads=v["bad"],
                              share=round(v["share"], 4)) for r, v in sorted(per_round.items())])
    return block, per_request


def _leakage(rows: dict[str, dict], names: dict, per_request: dict) -> None:
    """Every request of the run: 0 leaked, unless its last line says what it did (NaN:
    unmeasured)."""
    for key in names.values():
        per_request.setdefault(key, {"foreign_slots": 0, "unwritten_slots": 0})["attention_leakage"] = 0.0
    for row in rows.values():
        key = _where(row["request"], names)
        if key is not None:
            per_request[key]["attention_leakage"] = _leak(row)


def _leak(row: dict) -> float:
    """A leakage line's request's leakage: mass per sampled token (NaN: a token unmeasured)."""
    return math.nan if row["unmeasured"] or not row["tokens"] else row["mass"] / row["tokens"]


def group_names(groups: list | None) -> list[str]:
    """The KV cache groups a start line lists, as the summary names them."""
    return [("not followed" if g is None else f"sliding window {g['window']}" if g.get("window")
             else "full attention") for g in (groups or [])]
