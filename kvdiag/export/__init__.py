"""Publishing results: Prometheus metrics (textfile and HTTP exporter) from the run history."""
