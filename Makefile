# The two set-up commands of the README: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export RAY_USAGE_STATS_ENABLED := 0
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv demo test test-fast stress bench lint typecheck clean chromium

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch pinned exactly: a CPU wheel on this machine; never a plain `torch` requirement.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[torch,data,ray,test,hf,lightning,torchdata,torchtitan,lance,peer]'
	# datasets 5.x (Dataset.open of save_to_disk folders): torchtitan 0.3 pins datasets<4.8 in its
	# metadata, so it goes on its own line (pip warns; the torchtitan integration does not use it)
	$(PIP) install -q 'datasets>=5,<6' torch==2.13.0
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trainstore demo

# Headless Chromium for the report test (Debian's package). Without it the test is a visible
# skip locally and a failure in CI (CI=1).
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: the report browser test skips (fails with CI=1)"

test: $(STAMP) chromium lint
	$(PY) -m pytest -q -m "not slow and not stress" -p no:cacheprovider --durations=40 --durations-min=5

stress: $(STAMP)
	$(PY) -m pytest -q -m "stress or slow" -p no:cacheprovider

bench: $(STAMP)
	$(PIP) install -q -r benchmarks/requirements.txt
	$(PIP) install -q --no-deps -r benchmarks/peers.txt
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# ruff, the import contracts of pyproject.toml (layers, no circles) and the public API's types
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
