"""Every path kvdiag asks a server beyond OpenAI's /v1 API, and which engine answers it. The
live endpoint, its identity, cancels and kvdiag watch import these names; no module outside
kvdiag/engines/ spells an engine's path (tests/kvdiag/engines/test_routes.py holds it).

    METRICS      Prometheus text: vLLM, SGLang, kvdiag serve; llama.cpp with --metrics
    VERSION      vLLM (and kvdiag serve): {"version"}
    OPENAPI      FastAPI servers (vLLM, SGLang, kvdiag serve): info.title names kvdiag serve
    SERVER_INFO  SGLang: page_size, max_total_num_tokens, chunked_prefill_size, version (older
                 releases answer the second name)
    PROPS        llama.cpp: default_generation_settings.n_ctx, total_slots, build_info
    ABORT        SGLang: POST {"rid"} aborts the request its client named so
    RESET        POST: vLLM and kvdiag serve (/reset_prefix_cache), SGLang (/flush_cache)
"""

METRICS = "/metrics"
VERSION = "/version"
OPENAPI = "/openapi.json"
SERVER_INFO = ("/server_info", "/get_server_info")
PROPS = "/props"
LORA_ADAPTERS = "/lora-adapters"  # llama.cpp: the adapters it loaded, by id
ABORT = "/abort_request"
RESET = ("/reset_prefix_cache", "/flush_cache")
