"""The architecture checker behind ``tests/test_architecture.py``: reads a package tree with ``ast``.

Owns the mechanics, not the rules (those are data in ``tests/architecture_rules.py``). Every check is
a function of a package directory and the rules it is given, returning one line per violation (an
empty list means the tree obeys), so a test can plant a bad tree in a temporary directory and watch
the same function fail. Nothing here imports the package under check: sources are parsed, not run.

- :func:`collect_imports`: every ``import`` of every module, function-level ones included, resolved
  to the module it loads, marked when it sits under ``if TYPE_CHECKING:``;
- :func:`layer_violations`: imports between top-level units that the unit table does not grant,
  and forbidden third-party imports (e.g. torch in ``types``);
- :func:`outside_import_violations`: imports of a top-level package that sits beside the package and
  must never be imported by it (``benchmarks``, ``tests``, ``scripts``);
- :func:`cycle_violations`: runtime import cycles between files (type-only imports do not execute
  and do not count);
- :func:`module_size_violations`, :func:`function_size_violations`: the size limits.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Import",
    "collect_imports",
    "cycle_violations",
    "function_lengths",
    "function_size_violations",
    "layer_violations",
    "module_files",
    "module_size_violations",
    "outside_import_violations",
    "unit_of",
]


@dataclass(frozen=True)
class Import:
    """One import statement's effect: ``importer`` loads ``target``."""

    importer: str
    """Dotted name of the importing module (``asyncrl.reward.service``)."""
    target: str
    """The module loaded: the longest module of the tree the statement names (``from asyncrl.trainer
    import packing`` -> ``asyncrl.trainer.packing``; ``from asyncrl.reward import X`` ->
    ``asyncrl.reward``), or the top-level name of a third-party module (``torch``)."""
    internal: bool
    """Whether ``target`` is a module of the checked package."""
    file: str
    """The importer's path relative to the package's parent (``asyncrl/reward/service.py``)."""
    line: int
    type_only: bool
    """Under ``if TYPE_CHECKING:`` (never executed, so it cannot close a runtime cycle)."""

    @property
    def where(self) -> str:
        """``file:line`` of the statement."""
        return f"{self.file}:{self.line}"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the package directory ``root``.

    The package is named after the directory (``src/asyncrl`` -> ``asyncrl``); ``__init__.py`` files
    are named after their package."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _parse(path: Path) -> ast.Module:
    stat = path.stat()
    return _parse_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4096)
def _parse_cached(path: str, mtime_ns: int, size: int) -> ast.Module:
    """The syntax tree of ``path``, parsed once per version of the file (the checks share it)."""
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_imports(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement anywhere under ``node`` (functions, methods, ``try`` blocks ...), with
    whether it sits in the body of an ``if TYPE_CHECKING:``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, type_only
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for stmt in node.body:
            yield from _walk_imports(stmt, True)
        for stmt in node.orelse:
            yield from _walk_imports(stmt, type_only)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _walk_imports(child, type_only)


def _resolve(name: str, modules: Mapping[str, Path]) -> str:
    """The longest prefix of dotted ``name`` that is a module of the tree (``name`` if none)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return name


def collect_imports(root: Path) -> list[Import]:
    """Every import of every module under ``root``, resolved (see :class:`Import`).

    An import is an edge to the module it names; the parent packages' ``__init__`` that Python runs
    on the way are not edges of their own (a package's ``__init__`` has its own imports)."""
    modules = module_files(root)
    package = root.name
    out: list[Import] = []
    for module, path in modules.items():
        tree = _parse(path)
        is_package = path.name == "__init__.py"
        rel = str(path.relative_to(root.parent))
        for node, type_only in _walk_imports(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                names = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
                ]
            for name in dict.fromkeys(names):
                internal = name == package or name.startswith(package + ".")
                target = _resolve(name, modules) if internal else name.split(".")[0]
                out.append(Import(module, target, internal, rel, node.lineno, type_only))
    return out


def unit_of(module: str) -> str:
    """The top-level unit of a dotted module: its first sub-package or top-level module
    (``asyncrl.reward.math`` -> ``reward``; ``asyncrl.config.parse`` -> ``config``); the package's own
    ``__init__`` is the unit named like the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(
    root: Path,
    allowed: Mapping[str, frozenset[str]],
    forbidden_external: Mapping[str, frozenset[str]] | None = None,
    exceptions: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """Imports that cross from one unit to another the table ``allowed`` (unit -> the units it may
    import) does not grant; modules of a unit missing from the table; and imports of a third-party
    top-level package that ``forbidden_external`` (unit -> packages) forbids to a unit.

    ``exceptions`` maps (importing module, imported module) to the reason it is tolerated; an entry
    that matches no import is itself a violation, so the list cannot go stale."""
    exceptions = dict(exceptions or {})
    used: set[tuple[str, str]] = set()
    problems = {
        f"{path.relative_to(root.parent)}: unit {unit_of(module)!r} is not in the layer table"
        for module, path in module_files(root).items()
        if unit_of(module) not in allowed
    }
    for imp in collect_imports(root):
        unit = unit_of(imp.importer)
        if unit not in allowed:
            continue
        if not imp.internal:
            if imp.target in (forbidden_external or {}).get(unit, frozenset()):
                problems.add(f"{imp.where}: unit {unit!r} must not import {imp.target!r}")
            continue
        target_unit = unit_of(imp.target)
        if target_unit == unit or target_unit in allowed[unit]:
            continue
        if (imp.importer, imp.target) in exceptions:
            used.add((imp.importer, imp.target))
            continue
        problems.add(f"{imp.where}: {unit!r} must not import {target_unit!r} ({imp.target})")
    problems.update(f"layer exception {key} matches no import: remove it" for key in exceptions.keys() - used)
    return sorted(problems)


def outside_import_violations(root: Path, outside: frozenset[str]) -> list[str]:
    """Every import, anywhere in the package under ``root`` (function-level and ``TYPE_CHECKING`` ones
    included), of a top-level package named in ``outside``: ``import benchmarks``, ``from benchmarks.x
    import y``, ``from tests import z``. One line per import statement."""
    return sorted(
        f"{imp.where}: the product must not import {imp.target!r} (outside the package)"
        for imp in collect_imports(root)
        if not imp.internal and imp.target in outside
    )


def _strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def cycle_violations(root: Path, allowed_edges: Mapping[tuple[str, str], str] | None = None) -> list[str]:
    """File-level import cycles: each strongly connected set of modules in the graph of imports
    (function-level and ``TYPE_CHECKING`` ones included: a type-only import ties two modules as much as
    a runtime one, only without failing at import time), after removing the edges of
    ``allowed_edges`` ((importer, imported) -> reason). An allowed edge that no longer exists, or
    that closes no cycle, is reported too."""
    allowed_edges = dict(allowed_edges or {})
    graph: dict[str, set[str]] = {}
    for imp in collect_imports(root):
        if imp.internal and imp.target != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.target)
    problems = []
    for src, dst in allowed_edges:
        if dst not in graph.get(src, set()):
            problems.append(f"allowed cycle edge {src} -> {dst} is gone: remove it from the allow-list")
        elif not _reaches(graph, dst, src):
            problems.append(f"allowed cycle edge {src} -> {dst} closes no cycle: remove it from the allow-list")
    pruned = {src: {dst for dst in dsts if (src, dst) not in allowed_edges} for src, dsts in graph.items()}
    for component in _strongly_connected(pruned):
        edges = sorted(f"{s} -> {d}" for s in component for d in pruned.get(s, ()) if d in component)
        problems.append("import cycle among " + ", ".join(component) + ": " + "; ".join(edges))
    return problems


def _reaches(graph: Mapping[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        for succ in graph.get(node, ()):
            if succ not in seen:
                seen.add(succ)
                todo.append(succ)
    return False


def _check_sizes(sizes: Mapping[str, int], limit: int, allow: Mapping[str, str], what: str) -> list[str]:
    problems = [
        f"{name}: {size} lines, over the {what} limit of {limit}"
        for name, size in sorted(sizes.items())
        if size > limit and name not in allow
    ]
    for name in sorted(allow):
        if name not in sizes:
            problems.append(f"size allow-list names {name}, which does not exist: remove it")
        elif sizes[name] <= limit:
            problems.append(f"{name}: {sizes[name]} lines, within the {what} limit: remove it from the allow-list")
    return problems


def module_size_violations(root: Path, limit: int, allow: Mapping[str, str] | None = None) -> list[str]:
    """Modules over ``limit`` physical lines; ``allow`` maps a path relative to ``root``'s parent
    (``asyncrl/cli/train.py``) to the reason it may be longer. A stale allow-list entry is a violation."""
    sizes = {
        str(path.relative_to(root.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in module_files(root).values()
    }
    return _check_sizes(sizes, limit, allow or {}, "module")


def _span(node: ast.stmt) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def function_lengths(root: Path) -> dict[str, int]:
    """``asyncrl/pkg/mod.py::Class.method`` -> lines from its ``def`` to its last line, not counting
    its docstring (documentation is never the reason to split a function)."""
    out: dict[str, int] = {}
    for path in module_files(root).values():
        rel = str(path.relative_to(root.parent))
        tree = _parse(path)
        todo: list[tuple[ast.AST, str]] = [(tree, "")]
        while todo:
            node, prefix = todo.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = _span(child) - (_span(child.body[0]) if ast.get_docstring(child) is not None else 0)
                    name = prefix + child.name
                    out[f"{rel}::{name}"] = max(out.get(f"{rel}::{name}", 0), length)
                    todo.append((child, name + "."))
                elif isinstance(child, ast.ClassDef):
                    todo.append((child, prefix + child.name + "."))
                else:
                    todo.append((child, prefix))
    return out


def function_size_violations(root: Path, limit: int, allow: Mapping[str, str] | None = None) -> list[str]:
    """Functions (and methods, nested ones included) over ``limit`` lines by :func:`function_lengths`;
    ``allow`` maps ``asyncrl/pkg/mod.py::Class.method`` to the reason it may be longer."""
    return _check_sizes(function_lengths(root), limit, allow or {}, "function")
