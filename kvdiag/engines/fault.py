"""What a fault planted into a real engine is, whatever the engine: one catalog entry each
(engines/vllm/catalog.py, engines/sglang/faults.py), data only, so a name is checked and the
catalog listed before anything starts.

What a fault breaks (`effects`, the main one first):

    corrupts output      a request attends to K/V that another prefix (or other weights)
                         wrote: answers change, nothing fails, nothing is logged
    breaks isolation     requests that must not share blocks (another cache_salt, another
                         adapter) share them
    breaks ground truth  the probe's own reference (a salted isolated twin, or the first
                         request after /reset_prefix_cache) is served from the cache

How the live side of the detection matrix (kvdiag detect) runs it (`live`), and the verdict
a run that catches it gives:

    probe               the live probe with its default traffic             fail
    probe-adapter       the probe with --adapter canary-lora                fail
    probe-mamba         the probe of the Mamba hybrid with --prefix-match-  fail
                        unit 16 (hits inside a block: copy-on-write)
    probe-reuse         the probe of a server started with --cache-reuse    fail
                        256 (llama.cpp's chunk reuse)
    isolation           the tenant-isolation audit                          fail: leaks
    isolation-adapter   the isolation audit with --adapter canary-lora      fail: leaks
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvdiag.errors import KvdiagError

CORRUPTS_OUTPUT = "corrupts output"
BREAKS_ISOLATION = "breaks isolation"
BREAKS_GROUND_TRUTH = "breaks ground truth"
EFFECTS = (CORRUPTS_OUTPUT, BREAKS_ISOLATION, BREAKS_GROUND_TRUTH)
LIVE = ("probe", "probe-adapter", "probe-mamba", "probe-reuse", "isolation", "isolation-adapter")


@dataclass(frozen=True)
class Fault:
    name: str
    fault_class: str
    summary: str  # one line: what the planted engine does wrong
    plant_point: str  # file:function in the engine
    reports: tuple[str, ...]  # the real reports it re-creates
    effects: tuple[str, ...]  # from EFFECTS, the main one first
    traffic: str  # what a run must send for the fault to act
    live: str = "probe"  # from LIVE: how the detection matrix runs it live
    server_env: dict[str, str] = field(default_factory=dict)  # what the engine must run with
    # the event of a block's life it lives at (kvdiag.vocab.EVENTS), or None: a key-coverage
    # or isolation fault, which lives at the lookup
    event: str | None = None
    # path of the detection matrix (audit, live) -> why the fault cannot be reached there on
    # these machines; such a row is shown inconclusive with the reason, never counted as caught
    unreachable: dict[str, str] = field(default_factory=dict)
    # an engine planted by source patch (llama.cpp): fixes whose patches go in first, so the
    # fault is planted into a build that passes the traffic it needs
    after: tuple[str, ...] = ()

    @property
    def adapter(self) -> bool:
        """Whether its live run needs the server to serve its engine's adapter."""
        return self.live.endswith("-adapter")


def check_name(engine: str, catalog: Mapping[str, Fault], name: str | None) -> str | None:
    """A fault name of that engine's catalog, or None for none; an unknown name raises
    KvdiagError (exit 2) listing the known ones."""
    if not name:
        return None
    if name not in catalog:
        raise KvdiagError(f"unknown {engine} fault {name!r} (known: {', '.join(catalog)})")
    return name
