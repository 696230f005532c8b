"""Fixtures the real-engine tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2 imported in bfloat16 (the dtype vLLM serves it in) into a temporary directory,
    from the GGUF `make real-model` installs; skipped without it."""
    pytest.importorskip("gguf", reason="GGUF import needs the gguf package: make real-model")
    from kvdiag.models import gguf_import

    try:
        source = gguf_import.packaged_gguf()
    except Exception as e:
        pytest.skip(f"{e} (or: make real-model)")
    return gguf_import.import_gguf(source, tmp_path_factory.mktemp("smollm2") / "bf16", "bfloat16")
