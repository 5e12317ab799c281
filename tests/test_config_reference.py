"""``docs/config.md`` is the config classes' reference (``scripts/config_reference.py``): a field added,
removed, re-typed or re-described without regenerating it fails here, and so does a field without a
docstring."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from asyncrl.config import Config
from tests.script_module import load_script


@pytest.fixture(scope="module")
def reference():
    return load_script("config_reference")


def test_the_committed_reference_is_the_config_classes(reference) -> None:
    assert reference.current() == reference.render(), "run: python scripts/config_reference.py"


def test_every_field_of_the_tree_has_its_row(reference) -> None:
    text = reference.render()
    root = Config()
    for section in dataclasses.fields(root):
        for f in dataclasses.fields(getattr(root, section.name)):
            assert f"| `{section.name}.{f.name}` |" in text


def test_a_field_without_a_docstring_is_an_error(reference, tmp_path: Path) -> None:
    source = tmp_path / "tree.py"
    source.write_text('class A:\n    x: int = 1\n    """documented"""\n    y: int = 2\n')
    with pytest.raises(SystemExit, match="A.y"):
        reference.field_docs(source)
    source.write_text('class A:\n    x: int = 1\n    """documented"""\n')
    assert reference.field_docs(source) == {"A": {"x": "documented"}}
