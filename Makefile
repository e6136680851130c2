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

# Two pytest workers, one torch thread each: the suite is mostly short subprocesses and tiny shapes, so two
# single-threaded workers keep both cores busy where one two-threaded process leaves them idle (set
# PYTEST_WORKERS=0 to run in one process).
PYTEST_WORKERS ?= 2

test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

bench: $(STAMP)
	$(VENV)/bin/python scripts/bench_train.py

clean:
	rm -rf $(VENV) runs .pytest_cache
