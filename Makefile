# kvdiag. Two commands do all set-up on a fresh machine:
#   make reproduce   creates .venv if needed, installs, runs `kvdiag reproduce` on the canary
#   make test        the test suite (what CI runs through .ci/run)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
KVDIAG := $(VENV)/bin/kvdiag
TORCH := torch==2.13.0
PYTEST_ARGS ?= -m "not slow"

.PHONY: setup test test-all reproduce lint canary browser vllm-env bench clean

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

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest

reproduce: setup
	$(KVDIAG) reproduce --cases all

lint: setup
	$(VENV)/bin/ruff check .

# Rebuild the bundled canary (byte-identical to the committed files).
canary: setup
	$(KVDIAG) fixtures build-canary --out fixtures/canary

bench: setup
	$(PY) benchmarks/engine_vs_hf.py
	$(PY) benchmarks/guard_overhead.py

clean:
	rm -rf $(VENV) reports .pytest_cache
