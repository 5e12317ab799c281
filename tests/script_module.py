"""Import a file of ``scripts/`` as a module, so that a test can call its functions (the scripts are
not a package: each runs as ``python scripts/NAME.py``)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.repo_paths import SCRIPTS


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py``, executed once as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
