# `make demo` and `make test` set up what they need on a fresh machine, then run.
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

.PHONY: setup demo test bench clean

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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
