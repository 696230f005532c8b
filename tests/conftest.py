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


# The tiers (docs/testing.md). A test is `unit` unless marked otherwise: in-process, seconds.
# `e2e` starts a `kvdiag serve`, a CLI subprocess or a browser; `slow` takes more than ~30 s;
# the live-engine, wheel and GPU markers name what they need. `make test` runs unit and e2e.
NOT_UNIT = ("e2e", "slow", "vllm_live", "sglang_live", "llamacpp_live", "wheel", "gpu")
SLOW_AFTER = 45.0  # seconds: a test's call longer than this must be marked slow (30 s and a
# margin for a loaded CI machine); KVDIAG_SLOW_AFTER overrides it, 0 turns the rule off


def pytest_collection_modifyitems(config, items):
    import torch

    for item in items:
        if not any(m in item.keywords for m in NOT_UNIT):
            item.add_marker(pytest.mark.unit)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The slow marker's rule, enforced: a test outside the slow and live tiers whose call
    outlasts SLOW_AFTER fails, saying so (a shared fixture's setup is not counted)."""
    outcome = yield
    report = outcome.get_result()
    limit = float(os.environ.get("KVDIAG_SLOW_AFTER", SLOW_AFTER))
    if (call.when == "call" and report.passed and limit > 0 and call.duration > limit
            and not any(m in item.keywords for m in ("slow", "vllm_live", "sglang_live",
                                                     "llamacpp_live", "wheel"))):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {call.duration:.1f} s, over the {limit:.0f} s "
                           "a test outside the slow tier may take: mark it slow or make it faster")
