"""DESIGN §2 checked: who may import whom, no file import cycles, module and function sizes.

The rules are data in ``tests/architecture_rules.py``; the checker in ``tests/architecture.py`` reads
sources with ``ast`` (nothing is imported). The first tests hold the tree to the rules; the rest
plant violations in temporary trees and show that each check fails on them.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from tests import architecture_rules as rules
from tests.architecture import (
    cycle_violations,
    function_lengths,
    function_size_violations,
    layer_violations,
    module_size_violations,
    outside_import_violations,
)

SRC = Path(__file__).resolve().parents[1] / "src" / rules.PACKAGE
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def check_layers(root: Path) -> list[str]:
    return layer_violations(root, rules.LAYERS, rules.FORBIDDEN_EXTERNAL, rules.LAYER_EXCEPTIONS)


def check_cycles(root: Path) -> list[str]:
    return cycle_violations(root, rules.CYCLE_EXCEPTIONS)


def _report(problems: list[str]) -> str:
    return "\n".join(problems)


# --------------------------------------------------------------------------------------- the tree
def test_imports_follow_the_layer_table() -> None:
    problems = check_layers(SRC)
    assert not problems, _report(problems)


def test_the_product_never_imports_the_benchmarks() -> None:
    """The import contract of ``benchmarks/`` (beside ``src/``): it imports the product, never the reverse;
    nor does the product import the tests or the scripts."""
    problems = outside_import_violations(SRC, rules.OUTSIDE_THE_PRODUCT)
    assert not problems, _report(problems)


def test_a_product_import_of_the_benchmarks_fails_the_contract(tmp_path: Path) -> None:
    """Planted in a copy of the tree: a function-level ``from benchmarks...`` and a type-only ``import tests``."""
    package = plant(
        tmp_path,
        {
            "sim/__init__.py": "",
            "sim/driver.py": "def go():\n    from benchmarks.headline import run\n",
            "types.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tests.conftest\n",
        },
    )
    assert outside_import_violations(package, rules.OUTSIDE_THE_PRODUCT) == [
        "asyncrl/sim/driver.py:2: the product must not import 'benchmarks' (outside the package)",
        "asyncrl/types.py:3: the product must not import 'tests' (outside the package)",
    ]


def test_the_benchmarks_keep_the_size_limits() -> None:
    problems = [
        *module_size_violations(BENCHMARKS, rules.MODULE_LINES, rules.BENCHMARK_MODULE_SIZE_EXCEPTIONS),
        *function_size_violations(BENCHMARKS, rules.FUNCTION_LINES, rules.BENCHMARK_FUNCTION_SIZE_EXCEPTIONS),
    ]
    assert not problems, _report(problems)


def test_no_file_import_cycles() -> None:
    problems = check_cycles(SRC)
    assert not problems, _report(problems)


def test_module_sizes() -> None:
    problems = module_size_violations(SRC, rules.MODULE_LINES, rules.MODULE_SIZE_EXCEPTIONS)
    assert not problems, _report(problems)


def test_function_sizes() -> None:
    problems = function_size_violations(SRC, rules.FUNCTION_LINES, rules.FUNCTION_SIZE_EXCEPTIONS)
    assert not problems, _report(problems)


def test_the_rules_are_well_formed() -> None:
    """Every unit a row grants is a row of the table; the table has no loop (it is a hierarchy, so
    no two units can come to import each other); every exception says why."""
    for unit, grants in rules.LAYERS.items():
        assert grants <= rules.LAYERS.keys(), f"{unit} grants unknown units {sorted(grants - rules.LAYERS.keys())}"
    try:
        tuple(TopologicalSorter(rules.LAYERS).static_order())
    except CycleError as e:
        pytest.fail(f"the layer table loops: {e.args[1]}")
    for table in (
        rules.LAYER_EXCEPTIONS,
        rules.CYCLE_EXCEPTIONS,
        rules.MODULE_SIZE_EXCEPTIONS,
        rules.FUNCTION_SIZE_EXCEPTIONS,
    ):
        assert all(isinstance(why, str) and why.strip() for why in table.values())


# ----------------------------------------------------------------------------- planted violations
def plant(root: Path, files: dict[str, str]) -> Path:
    """A package tree ``root/asyncrl/...`` holding ``files`` (relative path -> source)."""
    package = root / rules.PACKAGE
    for rel, source in {"__init__.py": "", **files}.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return package


def test_violations_planted_in_a_copy_of_the_tree_fail_it(tmp_path: Path) -> None:
    """A copy of ``src/asyncrl`` with two imports added fails with exactly those beyond what the tree
    itself reports: one against DESIGN (algo -> trainer, inside a function) and a file cycle within
    ``reward`` (function-level too)."""
    copy = tmp_path / rules.PACKAGE
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def append(rel: str, source: str) -> int:
        """Append ``source`` to ``rel``; the line number of its first line."""
        path = copy / rel
        lines = len(path.read_text(encoding="utf-8").splitlines())
        with path.open("a", encoding="utf-8") as f:
            f.write("\n" + source)
        return lines + 2

    line = append("algo/losses.py", "def _planted():\n    from asyncrl.trainer.packing import pack\n")
    append("reward/arithmetic.py", "def _planted():\n    from asyncrl.reward import custom\n")
    append("reward/custom.py", "from asyncrl.reward import arithmetic  # noqa: E402\n")

    def new_problems(check: Callable[[Path], list[str]]) -> list[str]:
        return sorted(set(check(copy)) - set(check(SRC)))

    assert new_problems(check_layers) == [
        f"asyncrl/algo/losses.py:{line + 1}: 'algo' must not import 'trainer' (asyncrl.trainer.packing)"
    ]
    assert new_problems(check_cycles) == [
        "import cycle among asyncrl.reward.arithmetic, asyncrl.reward.custom: "
        "asyncrl.reward.arithmetic -> asyncrl.reward.custom; asyncrl.reward.custom -> asyncrl.reward.arithmetic"
    ]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"types.py": "import asyncrl.trainer.step\n", "trainer/__init__.py": "", "trainer/step.py": ""},
            ["asyncrl/types.py:1: 'types' must not import 'trainer' (asyncrl.trainer.step)"],
            id="module-level",
        ),
        pytest.param(
            {
                "reward/__init__.py": "",
                "reward/math.py": "def f():\n    from asyncrl.rollout import engine\n",
                "rollout/__init__.py": "",
                "rollout/engine.py": "",
            },
            ["asyncrl/reward/math.py:2: 'reward' must not import 'rollout' (asyncrl.rollout.engine)"],
            id="function-level",
        ),
        pytest.param(
            {
                "algo/__init__.py": "",
                "algo/loss.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from asyncrl.config import Config
             """,
                "config.py": "",
            },
            ["asyncrl/algo/loss.py:3: 'algo' must not import 'config' (asyncrl.config)"],
            id="type-only-still-counts",
        ),
        pytest.param(
            {
                "data/__init__.py": "",
                "data/a.py": "from ..controller.loop import run\n",
                "controller/__init__.py": "",
                "controller/loop.py": "",
            },
            ["asyncrl/data/a.py:1: 'data' must not import 'controller' (asyncrl.controller.loop)"],
            id="relative",
        ),
        pytest.param(
            {"config/parse.py": "import torch.nn\n"},
            ["asyncrl/config/parse.py:1: unit 'config' must not import 'torch'"],
            id="torch-in-config",
        ),
        pytest.param(
            {"gadgets.py": "import os\n"},
            ["asyncrl/gadgets.py: unit 'gadgets' is not in the layer table"],
            id="unknown-unit",
        ),
        pytest.param(
            {
                "trainer/__init__.py": "",
                "trainer/t.py": "from asyncrl.algo import losses\nimport torch\n",
                "algo/__init__.py": "",
                "algo/losses.py": "",
                "cli.py": "import asyncrl.sim\n",
                "sim/__init__.py": "from asyncrl import controller\n",
                "controller/__init__.py": "",
            },
            [],
            id="allowed",
        ),
    ],
)
def test_planted_layer_violations(tmp_path: Path, files: dict[str, str], expected: list[str]) -> None:
    assert check_layers(plant(tmp_path, files)) == expected


def test_layer_exceptions_excuse_one_import_and_go_stale(tmp_path: Path) -> None:
    root = plant(tmp_path, {"types.py": "from asyncrl import models\n", "models.py": ""})
    allowed = {"asyncrl": frozenset(), "types": frozenset(), "models": frozenset()}
    assert layer_violations(root, allowed) == ["asyncrl/types.py:1: 'types' must not import 'models' (asyncrl.models)"]
    assert layer_violations(root, allowed, exceptions={("asyncrl.types", "asyncrl.models"): "why"}) == []
    assert layer_violations(root, allowed, exceptions={("asyncrl.models", "asyncrl.types"): "why"}) == [
        "asyncrl/types.py:1: 'types' must not import 'models' (asyncrl.models)",
        "layer exception ('asyncrl.models', 'asyncrl.types') matches no import: remove it",
    ]


def test_planted_cycles(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "reward/__init__.py": "",
            "reward/service.py": "def client():\n    from asyncrl.reward.remote import Client\n",
            "reward/remote.py": "from asyncrl.reward import service\n",
            "reward/typed.py": """\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from asyncrl.reward.remote import X
        """,
            "reward/base.py": "import asyncrl.reward.typed\n",
        },
    )
    cycle = (
        "import cycle among asyncrl.reward.remote, asyncrl.reward.service: "
        "asyncrl.reward.remote -> asyncrl.reward.service; asyncrl.reward.service -> asyncrl.reward.remote"
    )
    assert cycle_violations(root) == [cycle]
    edge = ("asyncrl.reward.service", "asyncrl.reward.remote")
    assert cycle_violations(root, {edge: "why"}) == []
    # the type-only import from typed.py is an edge, but it closes no cycle, so excusing it is stale
    assert cycle_violations(root, {("asyncrl.reward.typed", "asyncrl.reward.remote"): "why"}) == [
        "allowed cycle edge asyncrl.reward.typed -> asyncrl.reward.remote closes no cycle: remove it from the "
        "allow-list",
        cycle,
    ]
    # a cycle closed only by a TYPE_CHECKING import is a cycle too
    typed = plant(
        tmp_path / "typed",
        {
            "reward/__init__.py": "",
            "reward/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from asyncrl.reward.b import B\n",
            "reward/b.py": "from asyncrl.reward import a\n",
        },
    )
    assert cycle_violations(typed) == [
        "import cycle among asyncrl.reward.a, asyncrl.reward.b: asyncrl.reward.a -> asyncrl.reward.b; "
        "asyncrl.reward.b -> asyncrl.reward.a"
    ]
    assert cycle_violations(root, {edge: "why", ("asyncrl.reward.base", "asyncrl.reward.typed"): "why"}) == [
        "allowed cycle edge asyncrl.reward.base -> asyncrl.reward.typed closes no cycle: remove it from the allow-list"
    ]


def test_planted_oversized_module_and_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(6))
    docstring = '    """' + "\n" * 20 + '    """\n'
    root = plant(
        tmp_path,
        {
            "big.py": "\n" * 60,
            "fns.py": f"def long():\n{body}\n\n\ndef documented():\n{docstring}{body}\n\n\nclass K:\n"
            f"    def method(self):\n        def inner():\n{body.replace('    ', '            ')}\n",
        },
    )
    lengths = function_lengths(root)
    assert lengths["asyncrl/fns.py::long"] == 7
    assert lengths["asyncrl/fns.py::documented"] == 7  # the docstring is not counted
    assert lengths["asyncrl/fns.py::K.method.inner"] == 7
    assert lengths["asyncrl/fns.py::K.method"] == 8
    assert module_size_violations(root, 60) == []
    assert module_size_violations(root, 59) == ["asyncrl/big.py: 60 lines, over the module limit of 59"]
    assert function_size_violations(root, 7) == ["asyncrl/fns.py::K.method: 8 lines, over the function limit of 7"]
    assert function_size_violations(root, 7, {"asyncrl/fns.py::K.method": "why"}) == []
    assert function_size_violations(root, 8, {"asyncrl/fns.py::K.method": "why", "asyncrl/x.py::gone": "why"}) == [
        "asyncrl/fns.py::K.method: 8 lines, within the function limit: remove it from the allow-list",
        "size allow-list names asyncrl/x.py::gone, which does not exist: remove it",
    ]
