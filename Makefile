# Two commands for a fresh machine: `make demo` (set up, run the default scenario) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements/lock.txt pyproject.toml 2>/dev/null | sha1sum | cut -c1-12)
SCENARIO ?= scenarios/quickstart.yaml

.PHONY: setup demo test test-fast docker figures bench profile clean lock help
FIGURES_PROFILE := $(if $(FAST),fast,full)
BACKEND ?= auto

help:
	@echo "make demo       set up everything and run $(SCENARIO) (Docker when possible, else local)"
	@echo "make test       the whole test suite (unit, slow training runs, Docker)"
	@echo "make test-fast  unit tests only (seconds)"
	@echo "make figures    run the paper's experiments, write figures/*.png and figures/results.md (FAST=1: minutes)"
	@echo "make bench      the benchmark suite, written to .bench/results.json and .bench/results.md (QUICK=1)"
	@echo "make profile    where a run's CPU goes: py-spy over $(SCENARIO) on the local backend, .bench/profile.svg"
	@echo "make clean      remove every container, network, cgroup and run directory of the emulator"

setup: $(STAMP)

$(STAMP): requirements/lock.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip >/dev/null
	$(BIN)/python -m pip install -q -c requirements/lock.txt -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

docker:
	@./scripts/docker-engine.sh || echo "continuing without Docker"

demo: setup docker
	$(BIN)/emulate doctor || true
	$(BIN)/emulate run $(SCENARIO)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not docker" $(PYTEST_ARGS)

figures: setup docker
	$(BIN)/python -m analysis.paper --profile $(FIGURES_PROFILE) --backend $(BACKEND) --out figures

bench: setup
	$(BIN)/python -m benchmarks $(if $(QUICK),--quick,) --out .bench

# py-spy is a profiler, not a dependency of the emulator: installed on demand, outside the lock.
profile: setup
	@$(BIN)/python -m pip show -q py-spy >/dev/null 2>&1 || $(BIN)/python -m pip install -q py-spy
	@mkdir -p .bench
	$(BIN)/py-spy record --subprocesses --rate 50 --output .bench/profile.svg -- \
		$(BIN)/emulate run $(SCENARIO) --backend local --out .bench/profile-runs --set training.max_updates=200 --quiet
	@echo "flame graph of every process of the run: .bench/profile.svg"

clean:
	-$(BIN)/emulate clean
	rm -rf runs figures .bench

lock:
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/pip install -q -e '.[test]'
	{ echo "# Exact versions for the host environment: pip install -c requirements/lock.txt -e '.[test]'"; \
	  echo "# Regenerate with: make lock"; .lockenv/bin/pip freeze --exclude-editable | grep -v '^-e'; } > requirements/lock.txt
	rm -rf .lockenv
