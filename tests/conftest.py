import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Tests never read or write the user's kvdiag cache (the contiguous reference cache,
    imported models): each session gets its own. A model a test needs is imported anew."""
    if "KVDIAG_TESTS_SHARED_CACHE" not in os.environ:
        os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="session", autouse=True)
def _threads():
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A random Qwen2 checkpoint, small enough that 16 sessions x 12 rounds of 4k-token
    histories run in seconds."""
    from tests.checkpoints import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2", max_pos=8192)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
