# The two commands of the README: `make run` and `make test`. Both set up .venv on first use.
# Recipes quote every path, so a checkout whose absolute path holds spaces works (the paths make
# itself sees are relative: VENV must not hold a space). scripts/first_hour.sh checks a fresh clone.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
RUN_ARGS ?=

.PHONY: run test lint install clean

$(STAMP): pyproject.toml scripts/install_torch.sh
	test -x "$(PY)" || python3 -m venv "$(VENV)"
	bash scripts/install_torch.sh "$(PY)"
	"$(PY)" -m pip install -e ".[dev]"
	touch "$(STAMP)"

install: $(STAMP)

run: $(STAMP)
	"$(VENV)/bin/asyncrl" train $(RUN_ARGS)

test: $(STAMP)
	"$(PY)" -m ruff check src tests benchmarks scripts
	"$(PY)" -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	"$(PY)" -m ruff check src tests benchmarks scripts

clean:
	rm -rf "$(VENV)" .cache runs
