"""kvdiag watch: a reverse proxy that checks a serving engine's prefix cache on its own
traffic, beside it (the over-hit oracle on every request, sampled isolated twins), with
Prometheus metrics, an append-only findings file and a page (docs/watch.md)."""
