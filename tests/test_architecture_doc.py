"""``docs/architecture.md``'s module map agrees with the tree (``scripts/module_map.py``): a module
added, removed or re-described without regenerating the map fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_module import load_script


@pytest.fixture(scope="module")
def module_map():
    return load_script("module_map")


def test_the_committed_module_map_is_the_trees(module_map) -> None:
    assert module_map.current() == module_map.render(), "run: python scripts/module_map.py"


def test_every_module_is_in_the_map_under_its_unit(module_map, tmp_path: Path) -> None:
    package = tmp_path / "asyncrl"
    (package / "rollout" / "envs").mkdir(parents=True)
    (package / "config").mkdir()
    (package / "__init__.py").write_text('"""The package."""\n')
    (package / "config/learn.py").write_text('"""Learning settings.\n\nMore detail."""\n')
    (package / "rollout" / "envs" / "maze.py").write_text('"""A maze | with a pipe."""\n')
    (package / "types.py").write_text("x = 1\n")
    text = module_map.render(package)
    config = text.index("### `config`")
    assert text.index("| `config/learn.py` | Learning settings. |") > config  # the config package, 1st paragraph
    assert "| `rollout/envs/maze.py` | A maze \\| with a pipe. |" in text
    assert "| `types.py` | (no docstring) |" in text
    assert "### `trainer`" not in text  # units without modules are left out
    (package / "plugins").mkdir()
    (package / "plugins" / "x.py").write_text('"""x"""\n')
    with pytest.raises(SystemExit, match="plugins"):
        module_map.render(package)
