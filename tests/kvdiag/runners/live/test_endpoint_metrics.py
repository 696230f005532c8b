"""Endpoint.metrics against a real prometheus_client exposition on loopback: a labelled
counter declared before its first increment (SGLang's retractions until one happens) reads
0, so "no retraction" is told apart from "no retraction counter"; once counted, its value."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server

from kvdiag.runners.live.endpoint import Endpoint
from tests.kvdiag.serving import free_port


def test_a_declared_counter_reads_zero_until_counted():
    registry = CollectorRegistry()
    retracted = Counter("sglang:num_retracted_requests_total", "Total number of retracted requests.",
                        labelnames=["model_name"], registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    endpoint = Endpoint(f"http://127.0.0.1:{port}", "canary")
    try:
        assert endpoint.metrics()["sglang:num_retracted_requests_total"] == 0.0
        assert "sglang:num_aborted_requests_total" not in endpoint.metrics()  # undeclared: absent
        retracted.labels(model_name="canary").inc(3)
        retracted.labels(model_name="other").inc(5)  # another model's: not this endpoint's
        assert endpoint.metrics()["sglang:num_retracted_requests_total"] == 3.0
    finally:
        endpoint.sync.close()
        server.shutdown()
        thread.join(timeout=5)
