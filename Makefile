# The two set-up commands: `make demo` and `make test`. Both create/refresh .venv and install what is missing.
PYTHON ?= python3
VENV ?= .venv
# Pinned first so pip never resolves a (multi-GB, CUDA) torch build on its own.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.meshlm-installed

.PHONY: demo test install clean bench

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/meshlm demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python scripts/bench_train.py

clean:
	rm -rf $(VENV) runs .pytest_cache
