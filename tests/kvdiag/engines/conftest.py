"""Fixtures the real-engine tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2 imported in float32 into a temporary directory, from the GGUF `make
    real-model` installs; skipped without it. vLLM serves the dtype the checkpoint stores:
    on a CPU without AVX-512 its bfloat16 matmuls fall back to a path that made the
    natural-style probe take over 3,000 s (CI timed out), where float32 took 1,146 s."""
    pytest.importorskip("gguf", reason="GGUF import needs the gguf package: make real-model")
    from kvdiag.models import gguf_import

    try:
        source = gguf_import.packaged_gguf()
    except Exception as e:
        pytest.skip(f"{e} (or: make real-model)")
    return gguf_import.import_gguf(source, tmp_path_factory.mktemp("smollm2") / "f32", "float32")
