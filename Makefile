# Two commands for a fresh machine: `make demo` (set up, run the default scenario) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements/lock.txt pyproject.toml 2>/dev/null | sha1sum | cut -c1-12)
SCENARIO ?= scenarios/quickstart.yaml

.PHONY: setup demo test test-fast docker figures reproduction bench profile clean lock help
FIGURES_PROFILE := $(or $(PROFILE),$(if $(FAST),fast,full))
BACKEND ?= auto
# What a target needs from outside the Python lock: scripts/system-deps.sh installs it when run
# as root (apt-get; py-spy with pip) and says what it could not install and the command that
# would; the target then goes on with what it has (Docker missing: the local backend; Fashion-MNIST
# missing: the best data set available, said in the results).
need = @./scripts/system-deps.sh $(1) || echo "$@: going on without what could not be installed (above)"
ENGINE := ./scripts/docker-engine.sh || echo "continuing without Docker"

help:
	@echo "make setup      .venv with the pinned Python packages (requirements/lock.txt)"
	@echo "make demo       set up everything (as root: Docker too) and run $(SCENARIO) (Docker when possible, else local)"
	@echo "make test       the whole test suite (unit, slow training runs, Docker)"
	@echo "make test-fast  unit tests only (under a minute)"
	@echo "make figures    the paper's experiments (as root: installs Docker, Fashion-MNIST), figures/*.png and figures/results.md (FAST=1: minutes; PROFILE=paper: the paper's regime, hours; ONLY="methods staleness": some experiments)"
	@echo "make reproduction  docs/reproduction/results.md and its figures regenerated from the committed run records (no Docker, no runs; make figures ... RECORDS=docs/reproduction/records adds records)"
	@echo "make bench      the benchmark suite (as root: installs Docker, Fashion-MNIST), .bench/results.json and .bench/results.md (QUICK=1)"
	@echo "make profile    where a run's CPU goes: py-spy (pip, into .venv) over $(SCENARIO) on the local backend, .bench/profile.svg"
	@echo "make clean      remove what killed runs left (emulate clean: live runs stay), and runs/, figures/, .bench/"

setup: $(STAMP)

$(STAMP): requirements/lock.txt pyproject.toml
	@test -x $(BIN)/python || PYTHON=$(PYTHON) ./scripts/system-deps.sh python3-venv || true
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip >/dev/null
	$(BIN)/python -m pip install -q -c requirements/lock.txt -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

docker:
	$(call need,docker)
	@$(ENGINE)

demo: setup
	$(call need,docker)
	@$(ENGINE)
	$(BIN)/emulate doctor || true
	$(BIN)/emulate run $(SCENARIO)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not docker" $(PYTEST_ARGS)

figures: setup
	$(call need,docker dataset-fashion-mnist)
	@$(ENGINE)
	$(BIN)/python -m emulator.experiments.paper --profile $(FIGURES_PROFILE) --backend $(BACKEND) --out figures $(if $(ONLY),--only $(ONLY)) $(if $(RECORDS),--records $(RECORDS))

# No Docker, no runs: docs/reproduction/results.md and its figures from the committed run records.
reproduction: setup
	$(BIN)/python -m emulator.experiments.paper --from-records docs/reproduction/records --out docs/reproduction

bench: setup
	$(call need,docker dataset-fashion-mnist)
	@$(ENGINE)
	$(BIN)/python -m benchmarks $(if $(QUICK),--quick,) --out .bench

# py-spy is a profiler, not a dependency of the emulator: installed on demand, outside the lock.
profile: setup
	@./scripts/system-deps.sh py-spy
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
