"""Runners against live OpenAI-compatible servers: the endpoint client, the probe and its pressure, the tenant-isolation audit."""
