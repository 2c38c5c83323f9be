PYTHON ?= python

.PHONY: install test demo clean

install:  ## the dependencies, pinned
	$(PYTHON) -m pip install -r requirements.txt

test:  ## the whole suite, CPU only, deterministic (a few minutes on 2 cores)
	$(PYTHON) -m pytest -q test_fgrpo.py

demo:  ## F-DAPO on the tiny offline model and toy task: about 2 minutes on 2 cores
	rm -rf runs/demo
	$(PYTHON) fgrpo.py --model tiny --algo dapo --gamma 1 --out runs/demo

clean:
	rm -rf runs .pytest_cache __pycache__
