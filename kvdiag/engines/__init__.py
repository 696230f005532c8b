"""The serving engines kvdiag starts, sizes and plants faults into: one server-process module, vLLM, SGLang, and kvdiag's own server."""
