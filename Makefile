# The two commands of the README. Both install first, so they work on a fresh machine.
PY ?= python
PIP ?= $(PY) -m pip

.PHONY: install demo test test-all bench docs

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev,atari,minatar]"  # the extras too, so the Atari and MinAtar tests run

demo: install
	$(PY) recipes/ppo.py logger.wandb_mode=offline

test: install
	$(PY) -m pytest -q

test-all: install
	$(PY) -m pytest -q -m "" 

bench: install
	cd $$(mktemp -d) && $(PY) $(CURDIR)/benchmarks/collectors.py --quick

docs:
	$(PY) docs/make_api.py
