# The two commands of the README: `make run` and `make test`. Both set up .venv on first use.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run test lint install clean

$(STAMP): pyproject.toml scripts/install_torch.sh
	test -x $(PY) || python3 -m venv $(VENV)
	bash scripts/install_torch.sh $(PY)
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/asyncrl train

test: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check src tests

clean:
	rm -rf $(VENV) .cache runs
