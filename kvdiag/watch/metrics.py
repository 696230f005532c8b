"""The watch's Prometheus metrics, served at /kvdiag/metrics on the proxy's own port. Counters
run from the proxy's start; the gauges hold the rates of the last closed window that had data
for them (NaN before one had). deploy/prometheus/kvdiag-rules.yaml alerts on them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

PATH = "/kvdiag/metrics"


class WatchMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("kvdiag_watch_requests", "Generation requests relayed to the end",
                                registry=r)
        self.judged = Counter("kvdiag_watch_judged", "Requests held against the over-hit bound",
                              registry=r)
        self.over_hits = Counter("kvdiag_watch_over_hits", "Requests whose reported cached tokens "
                                 "exceed what any request the proxy saw could have cached",
                                 registry=r)
        self.unjudged = Counter("kvdiag_watch_unjudged", "Requests not judged, by why",
                                ["why"], registry=r)
        self.twins = Counter("kvdiag_watch_twins", "Sampled twin pairs judged", registry=r)
        self.reached = Counter("kvdiag_watch_twins_reached", "Twin pairs whose shared replay hit "
                               "the cache", registry=r)
        self.departures = Counter("kvdiag_watch_twin_departures", "Twin pairs that departed "
                                  "beyond the isolated floor", registry=r)
        self.gauges = {name: Gauge(f"kvdiag_watch_{name}", text, registry=r) for name, text in (
            ("divergence_rate", "Departed twins over twins that hit the cache, last window"),
            ("divergence_low", "Its 95 % interval's low end"),
            ("divergence_high", "Its 95 % interval's high end"),
            ("sqdr", "SQDR of the sampled twins over conversation rounds, last window"),
            ("sqdr_low", "Its 95 % interval's low end"),
            ("sqdr_high", "Its 95 % interval's high end"),
            ("hit_rate", "The upstream's own prefix-cache hit rate: cached over prompt tokens"),
            ("warming", "1 while a hit above the bound is read as warm-up, not a finding"))}
        for g in self.gauges.values():
            g.set(float("nan"))

    def window(self, rates: dict) -> None:
        """A closed window's rates; one without data for a rate keeps the last value."""
        for name, value in rates.items():
            if name in self.gauges and value is not None:
                self.gauges[name].set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
