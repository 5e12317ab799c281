"""Check that a class satisfies a ``typing.Protocol`` structurally, without building an instance.

``isinstance`` with a ``runtime_checkable`` protocol only looks for names (and, before Python
3.12, evaluates properties, which for ``TrainerProcess.version`` would wait for a child process).
``protocol_problems`` looks at the class itself: every method of the protocol exists, is async
exactly when the protocol's is, and accepts the protocol's parameters (same names, in order, a
default wherever the protocol has one; extra parameters only with defaults); every data member
(a property of the protocol) is a class attribute, a property, a dataclass field, or assigned as
``self.<name>`` in an ``__init__`` of the class.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

_EMPTY = inspect.Parameter.empty


def protocol_members(protocol: type) -> dict[str, Any]:
    """The members a protocol declares (its own public names, and ``__call__`` for a callable one)."""
    return {name: value for name, value in vars(protocol).items() if not name.startswith("_") or name == "__call__"}


def _assigned_in_init(cls: type) -> set[str]:
    """Names assigned as ``self.<name>`` in the ``__init__`` of ``cls`` or its bases (a
    dataclass's: its fields)."""
    names: set[str] = set(getattr(cls, "__dataclass_fields__", {}))
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or not inspect.isfunction(init) or "__dataclass_fields__" in vars(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    if target.value.id == "self":
                        names.add(target.attr)
    return names


def _signature_problems(name: str, want: Any, have: Any) -> list[str]:
    problems = []
    if inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(have):
        problems.append(f"{name}: async must be {inspect.iscoroutinefunction(want)}")
    wanted = list(inspect.signature(want).parameters.values())[1:]
    given = list(inspect.signature(have).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL or p.kind is p.VAR_KEYWORD for p in given):
        return problems + [f"{name}: *args/**kwargs hide the signature"]
    for i, p in enumerate(wanted):
        if i >= len(given) or given[i].name != p.name:
            problems.append(f"{name}: parameter {i + 1} must be {p.name!r}")
        elif p.default is not _EMPTY and given[i].default is _EMPTY:
            problems.append(f"{name}: parameter {p.name!r} needs a default")
    for extra in given[len(wanted) :]:
        if extra.default is _EMPTY:
            problems.append(f"{name}: extra parameter {extra.name!r} needs a default")
    return problems


def protocol_problems(cls: type, protocol: type) -> list[str]:
    """What keeps ``cls`` from satisfying ``protocol`` (empty: it does)."""
    problems: list[str] = []
    in_init = None
    for name, want in protocol_members(protocol).items():
        have = inspect.getattr_static(cls, name, None)
        if isinstance(want, property):
            if have is None:
                in_init = _assigned_in_init(cls) if in_init is None else in_init
                if name not in in_init:
                    problems.append(f"{name}: not declared (attribute, property or self.{name} in __init__)")
        elif inspect.isfunction(want):
            if not inspect.isfunction(have):
                problems.append(f"{name}: missing method")
            else:
                problems.extend(_signature_problems(name, want, have))
    return problems
