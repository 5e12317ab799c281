"""Where the whole ``Config`` object travels from ``asyncrl.launch.local.train``: a static reading of the
source (parsed, never imported), as rooms (folders of the package), moves between them and the functions
that take the whole object.

``python scripts/config_reach.py`` prints the rooms, the counts, the room-to-room moves, every function
outside ``launch/`` that takes the whole config and the calls it could not follow; ``--json`` prints the
same as JSON; ``--moves`` lists every move. ``--src``/``--package``/``--start`` read another tree (an older
checkout: ``git archive <commit> src | tar -x -C DIR`` then ``--src DIR/src/asyncrl``).

What it counts (and what it does not):

- *The config* starts as the parameter ``cfg`` of the start function. Inside a function the config is held
  by: a parameter that received it, a local name assigned from an expression holding it (``x = cfg``,
  ``x = a or cfg``, ``x = cfg if c else y``), a local name assigned from a call that takes it and is
  annotated to return ``Config`` (``with_values(cfg, ...)``) or is ``copy``/``deepcopy``/``replace``, and
  ``self.<attr>`` of a class once any of its methods assigned the config to it. ``cfg.trainer`` (a section)
  is not the config: a section passed on is not followed.
- *A move* is one call site that passes the config (positionally or by keyword) into a function or class
  of the package: ``f(cfg)``, ``module.f(cfg)``, ``self.method(cfg)``, ``Class(cfg)`` (into its
  ``__init__``, or, for a dataclass without one, into the field it fills); and the indirect forms where
  the function is handed over with the config: ``partial(f, cfg)``, ``asyncio.to_thread(f, cfg)``,
  ``loop.run_in_executor(None, f, cfg)``, ``Process(target=f, args=(..., cfg))``. Each call site counts
  once however often its function is reached. Names resolve through ``import``/``from ... import``
  (also inside functions, relative ones and re-exports of ``__init__``), module attributes, ``self.`` and
  class names, and base classes of the package.
- *A room* is the folder of the module a function lives in: a subpackage of the package (``launch``,
  ``config``, ``controller`` ...), or ``(root)`` for a module directly under it (``models.py``). The start
  function's room is entered first. A move is *within* its room, *into a new room* (the first move into
  that room, in breadth-first order from the start), or *back* to a room already entered; so the back
  moves are the moves across rooms less the rooms entered after the first, whatever the order.
- A class whose object holds the config (``self.cfg = cfg``) has every method read as reached: a call in
  any of them that passes ``self.cfg`` on is a move (from the class's room).
- Not followed, and listed apart (``unresolved``): calls on objects whose type the source does not say
  (``engine.update(cfg)``, Ray actors' ``.remote(cfg)``), calls into other packages (``yaml``,
  ``dataclasses.asdict``); Python built-ins (``isinstance``, ``getattr`` ...) are not moves. Not seen:
  the config put in a container and taken out elsewhere, ``*args``/``**kwargs`` forwarding, ``setattr``.
- *Functions that take the whole config*: every function or class a move reaches, and every function with
  a parameter annotated ``Config`` (reached or not), outside ``launch/``.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "asyncrl"
START = "asyncrl.launch.local.train"
CONFIG_TYPE = "Config"
ROOT_ROOM = "(root)"

BUILTINS = frozenset(dir(builtins))
"""Python's built-in names: a call of one is no move (``isinstance(cfg, Config)``, ``getattr(cfg, k)``)."""

COPIERS = frozenset({"copy", "deepcopy", "replace"})
"""Calls whose result is the config they are given (``copy.deepcopy(cfg)``, ``dataclasses.replace(cfg, ...)``)."""


@dataclass
class Function:
    """A function or method of the package (nested ones too: ``outer.<locals>.inner``)."""

    qualname: str
    module: str
    cls: str | None
    node: ast.FunctionDef | ast.AsyncFunctionDef
    params: list[str]
    kwonly: list[str]
    annotated: list[str]
    returns_config: bool
    static: bool
    classmethod: bool = False
    local_defs: dict[str, str] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)


@dataclass
class Class:
    """A class of the package: its methods, its bases (as written) and, for a dataclass, its fields in order."""

    qualname: str
    module: str
    node: ast.ClassDef
    methods: dict[str, str]
    fields: list[str]


@dataclass
class Module:
    """A module of the package: its room, its imports (local name -> dotted target) and its top-level names."""

    name: str
    path: Path
    room: str
    is_package: bool
    imports: dict[str, str]
    defs: dict[str, str]


@dataclass
class Move:
    """One call site passing the config into a function or class of the package."""

    caller: str
    callee: str
    file: str
    line: int
    from_room: str
    to_room: str
    kind: str = ""
    via: str = ""


@dataclass
class Index:
    """Every module, function and class of the package, parsed."""

    package: str
    tree: Path = ROOT
    """Where file names are given from: the folder above ``src/`` (the checkout)."""
    modules: dict[str, Module] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, Class] = field(default_factory=dict)


def _annotation_is(node: ast.expr | None, name: str) -> bool:
    """Whether an annotation names ``name``: ``Config``, ``cfg_mod.Config``, ``"Config"``, ``Config | None``."""
    if node is None:
        return False
    if isinstance(node, ast.Name):
        return node.id == name
    if isinstance(node, ast.Attribute):
        return node.attr == name
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_is(ast.parse(node.value, mode="eval").body, name)
        except SyntaxError:
            return False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation_is(node.left, name) or _annotation_is(node.right, name)
    if isinstance(node, ast.Subscript):  # Optional[Config]
        return _annotation_is(node.slice, name)
    return False


def _imports_of(statements: list[ast.stmt] | ast.AST, module: Module, *, skip_functions: bool) -> dict[str, str]:
    """The names the ``import`` statements bind (local name -> dotted target), relative ones resolved."""
    found: dict[str, str] = {}
    todo: list[ast.AST] = list(statements) if isinstance(statements, list) else [statements]
    while todo:
        node = todo.pop()
        if skip_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    found[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.name.split(".")
                if not module.is_package:
                    parts = parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = f"{base}.{alias.name}"
        todo.extend(ast.iter_child_nodes(node))
    return found


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str], list[str]]:
    a = node.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    annotated = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if _annotation_is(p.annotation, CONFIG_TYPE)]
    return positional, [p.arg for p in a.kwonlyargs], annotated


def _decorated(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, name: str) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Name) and target.id == name) or (
            isinstance(target, ast.Attribute) and target.attr == name
        ):
            return True
    return False


def build_index(src: Path, package: str) -> Index:
    """Parse every ``*.py`` under ``src`` (the package's directory) into an ``Index``."""
    index = Index(package, src.resolve().parents[1])
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        parts = [package, *rel.with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        room = rel.parts[0] if len(rel.parts) > 1 else ROOT_ROOM
        module = Module(".".join(parts), path, room, is_package, {}, {})
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        module.imports = _imports_of(tree.body, module, skip_functions=True)
        index.modules[module.name] = module
        for node in tree.body:
            _index_node(index, module, node, prefix=module.name, cls=None, enclosing=None)
    return index


def _index_node(
    index: Index, module: Module, node: ast.stmt, prefix: str, cls: str | None, enclosing: Function | None
) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        qual = f"{prefix}.{node.name}"
        positional, kwonly, annotated = _params(node)
        fn = Function(
            qual,
            module.name,
            cls,
            node,
            positional,
            kwonly,
            annotated,
            _annotation_is(node.returns, CONFIG_TYPE),
            _decorated(node, "staticmethod"),
            _decorated(node, "classmethod"),
        )
        fn.imports = _imports_of(node.body, module, skip_functions=False)
        if enclosing is not None:
            fn.imports = {**enclosing.imports, **fn.imports}
            fn.local_defs = dict(enclosing.local_defs)
        nested = _nested_defs(node)
        fn.local_defs.update({n.name: f"{qual}.<locals>.{n.name}" for n in nested})
        index.functions[qual] = fn
        if prefix == module.name:
            module.defs[node.name] = qual
        for child in nested:
            _index_node(index, module, child, f"{qual}.<locals>", cls, fn)  # a closure's ``self`` is the method's
    elif isinstance(node, ast.ClassDef):
        qual = f"{prefix}.{node.name}"
        fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        klass = Class(qual, module.name, node, {}, fields if _decorated(node, "dataclass") else [])
        index.classes[qual] = klass
        if prefix == module.name:
            module.defs[node.name] = qual
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                klass.methods[child.name] = f"{qual}.{child.name}"
                _index_node(index, module, child, qual, qual, None)
    elif isinstance(node, (ast.If, ast.Try)):  # definitions under ``if TYPE_CHECKING:``/``try:``
        for child in [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]:
            _index_node(index, module, child, prefix, cls, enclosing)


def _nested_defs(node: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [
        c
        for c in ast.walk(node)
        if c is not node and isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)) and _direct_parent_function(node, c)
    ]


def _direct_parent_function(outer: ast.AST, inner: ast.AST) -> bool:
    """Whether ``inner`` is defined in ``outer`` with no function in between."""
    todo = list(ast.iter_child_nodes(outer))
    while todo:
        node = todo.pop()
        if node is inner:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


class Resolver:
    """Dotted names and expressions to the package's modules, functions and classes."""

    def __init__(self, index: Index) -> None:
        self.index = index

    def dotted(self, name: str, depth: int = 0) -> tuple[str, str] | None:
        """``("module" | "function" | "class", qualname)`` for a dotted name, following re-exports."""
        ix = self.index
        if depth > 20:
            return None
        if name in ix.modules:
            return "module", name
        if name in ix.functions:
            return "function", name
        if name in ix.classes:
            return "class", name
        parts = name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            prefix, rest = ".".join(parts[:i]), parts[i:]
            if prefix in ix.modules:
                imported = ix.modules[prefix].imports.get(rest[0])
                if imported and imported != name:
                    return self.dotted(".".join([imported, *rest[1:]]), depth + 1)
                return None
            if prefix in ix.classes and len(rest) == 1:
                method = self.method(prefix, rest[0])
                return ("function", method) if method else None
        return None

    def bases(self, cls: str) -> list[str]:
        klass = self.index.classes[cls]
        module = self.index.modules[klass.module]
        out = []
        for base in klass.node.bases:
            found = self.expr(base, module, None, None)
            if found and found[0] == "class":
                out.append(found[1])
        return out

    def method(self, cls: str, name: str, seen: frozenset[str] = frozenset()) -> str | None:
        """The method ``name`` of ``cls`` or of its first base in the package that has it."""
        if cls in seen:
            return None
        klass = self.index.classes[cls]
        if name in klass.methods:
            return klass.methods[name]
        for base in self.bases(cls):
            found = self.method(base, name, seen | {cls})
            if found:
                return found
        return None

    def dataclass_fields(self, cls: str) -> list[str]:
        fields: list[str] = []
        for base in reversed(self.bases(cls)):
            fields += [f for f in self.dataclass_fields(base) if f not in fields]
        return fields + [f for f in self.index.classes[cls].fields if f not in fields]

    def expr(self, node: ast.expr, module: Module, fn: Function | None, cls: str | None) -> tuple[str, str] | None:
        """What a name or attribute expression refers to in the package, or None."""
        if isinstance(node, ast.Name):
            if fn is not None and node.id in fn.local_defs and node.id not in fn.params:
                return "function", fn.local_defs[node.id]
            if fn is not None and node.id in fn.imports:
                return self.dotted(fn.imports[node.id])
            if node.id in module.defs:
                return self.dotted(module.defs[node.id])
            if node.id in module.imports:
                return self.dotted(module.imports[node.id])
            return None
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and cls is not None:
                method = self.method(cls, node.attr)
                return ("function", method) if method else None
            base = self.expr(node.value, module, fn, cls)
            if base is None:
                return None
            if base[0] == "module":
                return self.dotted(f"{base[1]}.{node.attr}")
            if base[0] == "class":
                method = self.method(base[1], node.attr)
                return ("function", method) if method else None
        return None


@dataclass
class Reach:
    """The result: rooms in the order entered, the moves, the classes holding the config, the rest."""

    start: str
    rooms: list[str]
    moves: list[Move]
    holding_classes: dict[str, list[str]]
    unresolved: list[dict[str, Any]]
    takes_config: list[dict[str, Any]]

    def counts(self) -> dict[str, int]:
        kinds = [m.kind for m in self.moves]
        return {
            "rooms": len(self.rooms),
            "moves": len(self.moves),
            "within": kinds.count("within"),
            "new_room": kinds.count("new"),
            "back": kinds.count("back"),
            "unresolved": len(self.unresolved),
        }

    def to_dict(self) -> dict[str, Any]:
        pairs: dict[str, int] = {}
        for m in self.moves:
            if m.from_room != m.to_room:
                key = f"{m.from_room} -> {m.to_room}"
                pairs[key] = pairs.get(key, 0) + 1
        return {
            "start": self.start,
            "counts": self.counts(),
            "rooms": self.rooms,
            "room_moves": dict(sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))),
            "takes_config_outside_launch": self.takes_config,
            "holding_classes": self.holding_classes,
            "unresolved": self.unresolved,
            "moves": [m.__dict__ for m in self.moves],
        }


class Walker:
    """The breadth-first walk from the start function (see the module docstring for what it counts)."""

    def __init__(self, index: Index) -> None:
        self.ix = index
        self.res = Resolver(index)
        self.param_slots: dict[str, set[str]] = {}
        self.class_slots: dict[str, set[str]] = {}
        self.moves: dict[tuple[str, int, int], Move] = {}
        self.unresolved: dict[tuple[str, int, int], dict[str, Any]] = {}
        self.queue: deque[str] = deque()
        self.order: dict[str, int] = {}

    def _file(self, module: Module) -> str:
        try:
            return module.path.resolve().relative_to(self.ix.tree).as_posix()
        except ValueError:
            return module.path.as_posix()

    def room(self, qual: str) -> str:
        target = self.ix.functions.get(qual) or self.ix.classes.get(qual)
        assert target is not None, qual
        return self.ix.modules[target.module].room

    def enqueue(self, qual: str, slots: set[str], force: bool = False) -> None:
        have = self.param_slots.setdefault(qual, set())
        if force or qual not in self.order or not slots <= have:
            have |= slots
            self.order.setdefault(qual, len(self.order))
            self.queue.append(qual)

    def hold_in_class(self, cls: str, attr: str) -> None:
        have = self.class_slots.setdefault(cls, set())
        if attr not in have:
            have.add(attr)
            for method in self.ix.classes[cls].methods.values():
                self.enqueue(method, set(), force=True)

    def run(self, start: str) -> Reach:
        if start not in self.ix.functions:
            raise SystemExit(f"config_reach: no function {start} in the tree")
        first = self.ix.functions[start]
        self.enqueue(start, {first.params[0] if first.params else "cfg"})
        while self.queue:
            self.visit(self.queue.popleft())
        return self.result(start)

    def _holds(self, node: ast.expr | None, names: set[str], cls: str | None) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return cls is not None and node.attr in self._class_holding(cls)
        if isinstance(node, ast.BoolOp):
            return any(self._holds(v, names, cls) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self._holds(node.body, names, cls) or self._holds(node.orelse, names, cls)
        if isinstance(node, ast.NamedExpr):
            return self._holds(node.value, names, cls)
        return False

    def _class_holding(self, cls: str) -> set[str]:
        held = set(self.class_slots.get(cls, set()))
        for base in self.res.bases(cls):
            held |= self._class_holding(base)
        return held

    def _derived(self, node: ast.expr, names: set[str], fn: Function, module: Module) -> bool:
        """A call that returns the config it is given (``with_values(cfg, ...)``, ``copy.deepcopy(cfg)``)."""
        if not isinstance(node, ast.Call):
            return False
        if not any(self._holds(a, names, fn.cls) for a in [*node.args, *(k.value for k in node.keywords)]):
            return False
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in COPIERS:
            return True
        target = self.res.expr(node.func, module, fn, fn.cls)
        return bool(target and target[0] == "function" and self.ix.functions[target[1]].returns_config)

    def visit(self, qual: str) -> None:
        fn = self.ix.functions[qual]
        module = self.ix.modules[fn.module]
        names = set(self.param_slots.get(qual, set()))
        assigns = [n for n in ast.walk(fn.node) if isinstance(n, (ast.Assign, ast.AnnAssign))]
        changed = True
        while changed:  # local names holding the config, to a fixpoint
            changed = False
            for node in assigns:
                value = node.value
                if value is None or not (self._holds(value, names, fn.cls) or self._derived(value, names, fn, module)):
                    continue
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and target.id not in names:
                        names.add(target.id)
                        changed = True
                    elif (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                        and fn.cls is not None
                    ):
                        self.hold_in_class(fn.cls, target.attr)
        calls = sorted(
            (n for n in ast.walk(fn.node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)
        )
        for call in calls:
            self.visit_call(fn, module, call, names)

    def visit_call(self, fn: Function, module: Module, call: ast.Call, names: set[str]) -> None:
        holds = lambda e: self._holds(e, names, fn.cls)  # noqa: E731
        positional = [i for i, a in enumerate(call.args) if holds(a)]
        keywords = [k.arg for k in call.keywords if k.arg and holds(k.value)]
        in_args_tuple = [
            i
            for k in call.keywords
            if k.arg == "args" and isinstance(k.value, (ast.Tuple, ast.List))
            for i, e in enumerate(k.value.elts)
            if holds(e)
        ]
        if not (positional or keywords or in_args_tuple):
            return
        site = (str(module.path), call.lineno, call.col_offset)
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name in BUILTINS and name not in module.defs and not (fn.imports.get(name) or module.imports.get(name)):
            return
        target = self._super(call, fn) or self.res.expr(call.func, module, fn, fn.cls)
        if target and target[0] in ("function", "class") and (positional or keywords):
            self.move(fn, module, call, target, positional, keywords, via="")
            return
        # the function handed over with the config: partial(f, cfg), to_thread(f, cfg), Process(target=f, args=(cfg,))
        handed = [(i, self.res.expr(a, module, fn, fn.cls)) for i, a in enumerate(call.args)]
        handed += [
            (-1, self.res.expr(k.value, module, fn, fn.cls)) for k in call.keywords if k.arg in ("target", "fn", "func")
        ]
        refs = [(i, t) for i, t in handed if t and t[0] == "function" and i not in positional]
        if refs:
            at, ref = refs[0]
            shifted = [i - at - 1 for i in positional if i > at] if at >= 0 else []
            self.move(
                fn,
                module,
                call,
                ref,
                shifted or in_args_tuple,
                [k for k in keywords if k != "args"],
                via=ast.unparse(call.func),
            )
            return
        if site in self.unresolved:
            return
        self.unresolved[site] = {
            "caller": fn.qualname,
            "call": ast.unparse(call.func),
            "file": self._file(module),
            "line": call.lineno,
        }

    def move(
        self,
        fn: Function,
        module: Module,
        call: ast.Call,
        target: tuple[str, str],
        positional: list[int],
        keywords: list[str],
        via: str,
    ) -> None:
        kind, qual = target
        slots: set[str] = set()
        callee = qual
        if kind == "class":
            init = self.res.method(qual, "__init__")
            if init is not None:
                callee = init
                slots = self._bind(self.ix.functions[init], positional, keywords, bound=True)
            else:
                fields = self.res.dataclass_fields(qual)
                for name in [fields[i] for i in positional if i < len(fields)] + [k for k in keywords if k in fields]:
                    self.hold_in_class(qual, name)
        else:
            target_fn = self.ix.functions[qual]
            bound = target_fn.classmethod or (
                target_fn.cls is not None and not target_fn.static and self._called_bound(call, module, fn)
            )
            slots = self._bind(target_fn, positional, keywords, bound=bound)
        site = (str(module.path), call.lineno, call.col_offset)
        if site not in self.moves:
            self.moves[site] = Move(
                fn.qualname, callee, self._file(module), call.lineno, module.room, self.room(qual), via=via
            )
        if callee in self.ix.functions:
            self.enqueue(callee, slots)

    def _super(self, call: ast.Call, fn: Function) -> tuple[str, str] | None:
        """``super().method(...)``: the method of the first base of the caller's class that has it."""
        func = call.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
            and fn.cls
        ):
            return None
        for base in self.res.bases(fn.cls):
            method = self.res.method(base, func.attr)
            if method:
                return "function", method
        return None

    def _called_bound(self, call: ast.Call, module: Module, fn: Function) -> bool:
        """``obj.method(...)`` and ``self.method(...)``: the first parameter is bound; ``Class.method(x, ...)`` and a
        closure called by its name not."""
        if not isinstance(call.func, ast.Attribute):
            return False
        owner = self.res.expr(call.func.value, module, fn, fn.cls)
        return not (owner and owner[0] == "class")

    @staticmethod
    def _bind(target: Function, positional: list[int], keywords: list[str], bound: bool) -> set[str]:
        params = target.params[1:] if bound else target.params
        slots = {params[i] for i in positional if i < len(params)}
        return slots | {k for k in keywords if k in target.params or k in target.kwonly}

    def result(self, start: str) -> Reach:
        ordered = sorted(self.moves.values(), key=lambda m: (self.order.get(m.caller, 1 << 30), m.file, m.line))
        entered = [self.room(start)]
        for m in ordered:
            if m.to_room == m.from_room:
                m.kind = "within"
            elif m.to_room in entered:
                m.kind = "back"
            else:
                m.kind = "new"
                entered.append(m.to_room)
        reached = {m.callee for m in ordered}
        takes: dict[str, dict[str, Any]] = {}
        for qual in sorted(reached):
            if self.room(qual) != "launch":
                target = self.ix.functions.get(qual) or self.ix.classes[qual]
                takes[qual] = {
                    "function": qual,
                    "room": self.room(qual),
                    "reached": True,
                    "annotated": bool(getattr(target, "annotated", [])),
                }
        for qual, f in self.ix.functions.items():
            if f.annotated and self.room(qual) != "launch" and qual not in takes:
                takes[qual] = {"function": qual, "room": self.room(qual), "reached": False, "annotated": True}
        holding = {cls: sorted(attrs) for cls, attrs in sorted(self.class_slots.items())}
        unresolved = sorted(self.unresolved.values(), key=lambda u: (u["file"], u["line"]))
        return Reach(start, entered, ordered, holding, unresolved, sorted(takes.values(), key=lambda t: t["function"]))


def reach(src: Path = SRC, package: str = "asyncrl", start: str = START) -> Reach:
    """The walk of the tree at ``src`` (the package's directory) from ``start``."""
    return Walker(build_index(src, package)).run(start)


def render(result: Reach, moves: bool = False) -> str:
    """The table printed by default."""
    c = result.counts()
    d = result.to_dict()
    lines = [
        f"from {result.start}: the whole config enters {c['rooms']} rooms in {c['moves']} moves "
        f"({c['within']} within a room, {c['new_room']} into a new room, {c['back']} back to a room already entered)",
        "",
        "rooms, in the order entered: " + ", ".join(result.rooms),
        "",
        "moves across rooms:",
        *(f"  {pair:<28} {n:>3}" for pair, n in d["room_moves"].items()),
        "",
        f"functions outside launch/ that take the whole config ({len(result.takes_config)}):",
        *(
            f"  {t['function']:<64} {t['room']:<12} {'reached' if t['reached'] else 'annotated, not reached'}"
            for t in result.takes_config
        ),
        "",
        "classes whose object holds it: "
        + (", ".join(f"{k} ({', '.join(v)})" for k, v in d["holding_classes"].items()) or "none seen"),
        "",
        f"calls passing it that this reading does not follow ({c['unresolved']}):",
        *(f"  {u['file']}:{u['line']}  {u['call']}(...)  in {u['caller']}" for u in result.unresolved),
    ]
    if moves:
        lines += ["", "moves:"]
        lines += [
            f"  {m.kind:<6} {m.from_room:>10} -> {m.to_room:<10} {m.file}:{m.line}  {m.caller} -> {m.callee}"
            + (f"  (via {m.via})" if m.via else "")
            for m in result.moves
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=SRC, help="the package's directory (default src/asyncrl)")
    parser.add_argument("--package", default="asyncrl", help="the package's import name (default asyncrl)")
    parser.add_argument("--start", default=START, help=f"the function the config enters first (default {START})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--moves", action="store_true", help="list every move in the table")
    args = parser.parse_args(argv)
    result = reach(args.src, args.package, args.start)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render(result, args.moves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
