"""The environment registry: ``agent.env`` names resolved through Python entry points.

Owns the lookup from the config's ``agent.env`` to a maker of one episode's ``Environment``:

- a registered name: an entry point of the group ``asyncrl.environments`` (:data:`GROUP`) of any installed
  distribution; the project's own (``calculator``, ``python``) are registered in its ``pyproject.toml``
  the same way a third party registers one (``[project.entry-points."asyncrl.environments"]``,
  ``name = "pkg.module:make"``), so adding an environment never edits this project;
- ``gym:<id or pkg.module:Class>``: a Gymnasium environment with text observations and actions, through
  ``envs.gym.make_gymnasium`` (``gymnasium.make(id)``, or the class instantiated with no arguments);
- ``skyrl:<id or pkg.module:Class>``: a skyrl-gym text environment, through ``envs.skyrl.make_skyrl``;
- ``openenv:<url or pkg.module:Class>``: an OpenEnv HTTP environment, through ``envs.openenv.make_openenv``;
- ``pkg.module:make``: a maker imported directly, without registering it.

A maker is called once per episode as ``make(options: EnvOptions)`` and returns an ``Environment``
(async ``reset``/``step``/``close``). :func:`env_maker` loads it and checks the first environment it makes
(handed out to the first episode), so a name that is unknown, a maker that fails, or one that returns
something else is refused in one line at the start of a run, never mid-episode.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

from asyncrl.rollout.envs.base import Environment, EnvOptions

__all__ = ["GROUP", "PREFIXES", "EnvMaker", "env_maker", "registered"]

GROUP = "asyncrl.environments"
"""The entry-point group environments are registered under."""

EnvMaker = Callable[[EnvOptions], Environment]
"""Makes one episode's environment."""

_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def registered() -> dict[str, str]:
    """Every registered environment: name -> ``pkg.module:attr`` (installed distributions' entry points)."""
    found: dict[str, set[str]] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, set()).add(ep.value)
    clashes = {name: values for name, values in found.items() if len(values) > 1}
    if clashes:
        name, values = next(iter(sorted(clashes.items())))
        raise ValueError(f"agent.env={name} is registered more than once ({', '.join(sorted(values))}): uninstall one")
    return {name: next(iter(values)) for name, values in sorted(found.items())}


PREFIXES = ("gym:<id or pkg.module:Class>", "skyrl:<id or pkg.module:Class>", "openenv:<url or pkg.module:Class>")
"""The adapters selected by a prefix (the module docstring)."""


def _choices(names: dict[str, str]) -> str:
    return ", ".join([*names, *PREFIXES, "pkg.module:make"])


def _prefixed(spec: str) -> EnvMaker | None:
    """The maker of an adapter selected by a prefix (``gym:``, ``skyrl:``, ``openenv:``); None for other specs."""
    kind, _, target = spec.partition(":")
    match kind:
        case "gym":
            from asyncrl.rollout.envs.gym import make_gymnasium

            if not target:
                raise ValueError("agent.env=gym: needs a Gymnasium id or pkg.module:Class, e.g. gym:mypkg.envs:Guess")
            return lambda options: make_gymnasium(target, options)
        case "skyrl":
            from asyncrl.rollout.envs.skyrl import make_skyrl

            make_skyrl(target, EnvOptions())  # an unknown id or class: refused here, in one line
            return lambda options: make_skyrl(target, options)
        case "openenv":
            from asyncrl.rollout.envs.openenv import make_openenv

            return lambda options: make_openenv(target, options)
        case _:
            return None


def _load(spec: str) -> EnvMaker:
    """The maker ``spec`` names (see the module docstring)."""
    prefixed = _prefixed(spec)
    if prefixed is not None:
        return prefixed
    names = registered()
    if spec in names:
        value = names[spec]
    elif _SPEC.fullmatch(spec):
        value = spec
    else:
        raise ValueError(f"agent.env={spec!r} is not a registered environment; registered: {_choices(names)}")
    try:
        maker = EntryPoint(spec, value, GROUP).load()
    except (ImportError, AttributeError) as e:
        raise ValueError(f"agent.env={spec}: cannot load {value} ({type(e).__name__}: {e})") from None
    if not callable(maker):
        raise ValueError(f"agent.env={spec}: {value} is not callable (a maker: EnvOptions -> Environment)")
    return maker


def _check(spec: str, env: object) -> Environment:
    step = getattr(env, "step", None)
    if not isinstance(env, Environment) or not inspect.iscoroutinefunction(step):
        raise ValueError(
            f"agent.env={spec}: the maker returned {type(env).__name__}, not an Environment (async reset/step/close; "
            "a Gymnasium env goes through agent.env=gym:...)"
        )
    return env


def env_maker(spec: str, options: EnvOptions) -> Callable[[], Environment]:
    """A maker of fresh ``agent.env=spec`` environments (one per episode) with ``options``; ValueError (one
    line) when ``spec`` names none, or its maker fails or returns something else (see the module docstring)."""
    maker = _load(spec)
    try:
        first: list[Environment] = [_check(spec, maker(options))]
    except ValueError as e:
        raise ValueError(str(e) if str(e).startswith("agent.env=") else f"agent.env={spec}: {e}") from None
    except Exception as e:  # a third party's maker: its failure, said in one line at the start
        raise ValueError(f"agent.env={spec}: its maker failed ({type(e).__name__}: {e})") from None

    def make() -> Environment:
        if first:
            return first.pop()
        return _check(spec, maker(options))

    return make
