# The two commands of the README. Both install first, so they work on a fresh machine.
PY ?= python
PIP ?= $(PY) -m pip

.PHONY: install demo test test-all bench docs gpu-wheels gpu-check

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev,atari,minatar,distributed,marl]"  # the extras too, so their tests run

demo: install
	$(PY) recipes/ppo.py logger.wandb_mode=offline

# Two pytest workers (pytest-xdist); the tests that share a cluster run in one of them (tests/conftest.py).
TEST_WORKERS ?= 2

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-all: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m ""

bench: install
	cd $$(mktemp -d) && $(PY) $(CURDIR)/benchmarks/collectors.py --quick

docs:
	$(PY) docs/make_api.py

# The prepared GPU check (benchmarks/gpu_check.py), one command wherever pip can download: `make gpu-check` fetches
# into the git-ignored .whl/ what the lent GPU machine lacks (it has Python 3.12, torch 2.11.0+cu130, numpy, opencv,
# pytest; no package index) when .whl/ is missing, installs it beside that machine's torch and rewrites the check's
# section of $(GPU_PAGE) in place (with $OUT set: a copy in $OUT, written as the check runs, so a call cut off at its
# time limit still returns the steps that ran; copy it back over docs/gpu.md here).
# For the lent machine, `make gpu-wheels` here and carry .whl/ there. GPU_CHECK_ARGS: e.g. --skip atari.
GPU_PY ?= python3
GPU_PAGE ?= docs/gpu.md
GPU_CHECK_ARGS ?=
GPU_WHEELS = tensordict==0.14.3 torchrl==0.14.1 pyvers==0.2.3 hoptorch==0.1.4 orjson==3.13.0 \
	importlib_metadata==10.2.0 gymnasium==1.4.0 farama-notifications==0.0.4 ale-py==0.12.1
GPU_PLATFORMS = manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64

gpu-wheels:
	rm -rf .whl
	@$(MAKE) --no-print-directory .whl

# Downloaded into a temporary folder renamed .whl/ once complete, so an interrupted download never passes for the
# wheels; where pip cannot download them, one line says what to do instead of pip's log. With them go an Atari-only
# envpool and the wheels it imports (benchmarks/envpool_wheel.py: envpool and its assets exceed a call's 64 MiB).
.whl:
	@part=$$(mktemp -d .whl.XXXXXX) && log=$$part/pip.log && \
	if $(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(addprefix --platform ,$(GPU_PLATFORMS)) -d $$part/wheels $(GPU_WHEELS) >$$log 2>&1 && \
		$(PY) benchmarks/envpool_wheel.py --out $$part/wheels >>$$log 2>&1; then \
		mv $$part/wheels .whl && rm -rf $$part && du -sh .whl; \
	else \
		echo "error: the GPU check needs its wheels in .whl/ and pip could not download them here" \
			"($$(grep -m1 '^ERROR' $$log || tail -n1 $$log)); run make gpu-wheels where pip reaches a package" \
			"index and copy .whl/ here" >&2; \
		rm -rf $$part; exit 2; \
	fi

gpu-check: | .whl
	$(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tdrl-site \
		.whl/*.whl
	page=$(GPU_PAGE); if [ -n "$$OUT" ]; then cp $(GPU_PAGE) "$$OUT/" && page="$$OUT/$$(basename $(GPU_PAGE))"; fi; \
	PYTHONPATH=/tmp/tdrl-site:$(CURDIR) $(GPU_PY) benchmarks/gpu_check.py --markdown "$$page" $(GPU_CHECK_ARGS); \
		status=$$?; if [ "$$page" != $(GPU_PAGE) ]; then cp "$$page" $(GPU_PAGE); fi; exit $$status
