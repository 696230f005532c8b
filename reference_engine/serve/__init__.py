"""The reference engine behind an OpenAI-compatible HTTP server."""
