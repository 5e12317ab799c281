"""The architecture of ``src/asyncrl`` as data (DESIGN §2), checked by ``tests/test_architecture.py``.

Owns the rule table and every exception to it; the checker (``tests/architecture.py``) owns no rule.
A *unit* is a top-level module or sub-package of ``asyncrl`` (``reward``, ``types``, ...); a module
may import any module of its own unit and of the units its row lists, nothing else of the project.
Every exception names one import or one function and says why; an exception that no longer matches
anything fails the test, so the lists only shrink.
"""

from __future__ import annotations

PACKAGE = "asyncrl"

# The foundation every stage may meet in (DESIGN: "they meet in types and models").
BASE = frozenset({"types", "config", "choices", "auth", "web", "models", "storage"})
# The stages of DESIGN §1; they do not import each other (the trainer may use algo).
STAGES = frozenset({"algo", "data", "rollout", "reward", "trainer"})

LAYERS: dict[str, frozenset[str]] = {
    # foundation: import nothing of the project (but the config its choices)
    PACKAGE: frozenset(),  # asyncrl/__init__.py: the version only
    "types": frozenset(),  # records that cross stage boundaries
    "choices": frozenset(),  # the Literal alias of every config choice, shared by the config and the stages
    "config": frozenset({"choices"}),  # the config tree; its choice fields are typed by the aliases
    "auth": frozenset(),  # API keys and bind checks of the servers (not named in DESIGN §2)
    # the one HTTP stack (aiohttp) of every server and client: a package (server, connection, schema, checks,
    # client; DESIGN §2 "web/")
    "web": frozenset({"auth"}),
    "storage": frozenset(),  # the disk-full error of a run's writers (not named in DESIGN §2)
    "results": frozenset({"config"}),  # result files never overwritten (its error is a ConfigError)
    "models": frozenset({"types", "config", "choices"}),
    # the stages
    # pure tensor functions (DESIGN: "algo/ advantages.py, losses.py (pure)"); ``choices`` is a leaf of Literal
    # aliases (``LossType``, ...) that types both algo's parameters and the config's fields: one definition
    "algo": frozenset({"choices"}),
    "reward": frozenset({"auth", "web"}),  # verifiers run in worker processes: nothing else of the project
    "data": BASE,
    "rollout": BASE,
    "trainer": BASE | {"algo"},
    # composition and the top
    "controller": BASE | STAGES,
    "launch": BASE | STAGES | {"controller"},
    # the simulator drives the controller's own admission and batch rules (controller.staleness, .buffer),
    # measures a simulated run with controller.throughput's definition and sizes the named workloads of
    # data.workloads; nothing below imports it
    "sim": BASE | {"controller", "data", "results"},
    # the Tinker-compatible training service (docs/tinker.md): the trainer's LoRA, algo's losses and rollout's
    # engine behind the client's REST paths; like launch it composes stages, and only the CLI imports it
    "service": BASE | {"algo", "rollout", "trainer"},
    "cli": BASE | STAGES | {"controller", "launch", "sim", "results", "service"},
}

OUTSIDE_THE_PRODUCT = frozenset({"benchmarks", "tests", "scripts"})
"""Top-level packages of the repository beside ``src/`` that import the product and that no module of the
product may import, at any level (a function-level import counts; ``TYPE_CHECKING`` ones too): the
experiment drivers (``benchmarks/``), the tests and the scripts. The installed package must run without
them."""

BENCHMARK_MODULE_SIZE_EXCEPTIONS: dict[str, str] = {
    # Past 500 only by ruff's wrapping of statements that were hand-packed under ``# fmt: skip``.
    "benchmarks/ablation.py": "one bench: the controlled-lag ablation's arms, cells and their statistics",
    "benchmarks/headline.py": "one bench: the headline's arms, time-to-target analysis and re-evaluation",
    "benchmarks/objectives.py": "one bench: the objectives comparison's plan, step-size tuning and cells",
}
"""``benchmarks/module.py`` -> why it may pass ``MODULE_LINES``."""

BENCHMARK_FUNCTION_SIZE_EXCEPTIONS: dict[str, str] = {
    # Past 80 only by ruff's wrapping (each was under 80 hand-packed); drivers read top to bottom.
    "benchmarks/async_bench.py::run_async_bench": (
        "the bench's driver: both arms per seed in one invocation, then their summary, in run order"
    ),
    "benchmarks/headline.py::analyse": (
        "the headline's analysis: time to target per arm and seed, the ratio and its interval, in one pass"
    ),
    "benchmarks/headline.py::run_headline_bench": (
        "the bench's driver: arms interleaved per seed in one invocation, then the analysis, in run order"
    ),
    "benchmarks/engine.py::run_interrupt_cost": (
        "one benchmark: three modes (none, abort, keep) over shared prompts, weight versions and a reference "
        "model, held by two closures; measurement code whose numbers are committed under docs/results/"
    ),
}
"""``benchmarks/module.py::function`` -> why it may pass ``FUNCTION_LINES`` (the benchmarks keep the product's
size limits: ``tests/test_architecture.py``)."""

FORBIDDEN_EXTERNAL: dict[str, frozenset[str]] = {
    # DESIGN: "types/config import no torch" (transformers would import it for them).
    "types": frozenset({"torch", "transformers"}),
    "config": frozenset({"torch", "transformers"}),
    "choices": frozenset({"torch", "transformers"}),
}

LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported module) -> why this import may cross the table. Empty: the tree obeys."""

CYCLE_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported module) -> why this edge may close a file cycle. Type-only imports
(``if TYPE_CHECKING:``) never count; function-level imports do."""

MODULE_LINES = 500
FUNCTION_LINES = 80
"""Lines from ``def`` to the function's end, its docstring not counted."""

MODULE_SIZE_EXCEPTIONS: dict[str, str] = {
    # None today: a module past the cap is split along what it owns, or named here with why it cannot be.
}
"""``asyncrl/path.py`` -> why it may pass ``MODULE_LINES``."""

FUNCTION_SIZE_EXCEPTIONS: dict[str, str] = {
    "asyncrl/algo/losses.py::policy_loss": (
        "the whole DESIGN §5 objective (four loss types, behaviour cap, drop mask) with its argument "
        "checks and sixteen statistics, read top to bottom beside the formula"
    ),
    "asyncrl/reward/code.py::run_code_tests": (
        "one try/finally owns the sandbox's pipe, process and work directory; split, the cleanup order "
        "that the sandbox's safety rests on would be spread over several functions"
    ),
}
"""``asyncrl/path.py::Qualified.name`` -> why it may pass ``FUNCTION_LINES``."""
