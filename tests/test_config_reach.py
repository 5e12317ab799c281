"""``scripts/config_reach.py``: the walk of the whole config from a start function, on a small package written
here (every counted form and every one it must not count), then on the repository's own tree."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from textwrap import dedent

import pytest

from tests.repo_paths import SCRIPTS

FILES = {
    "__init__.py": "",
    "models.py": """
        def load(cfg):
            return cfg
    """,
    "config/__init__.py": "from pkg.config.tree import Config, with_values\n",
    "config/tree.py": """
        class Config:
            trainer: object = None

        def with_values(cfg: Config, values: dict) -> Config:
            return cfg
    """,
    "launch/__init__.py": "",
    "launch/local.py": """
        import asyncio

        from pkg import models
        from pkg.config import Config, with_values
        from pkg.ctl.holder import Holder
        from pkg.data.box import Box

        from . import stages


        def train(cfg: Config) -> None:
            cfg = with_values(cfg, {})
            stages.build(cfg)
            models.load(cfg)
            models.load(cfg.trainer)
            isinstance(cfg, Config)
            asyncio.run(asyncio.to_thread(run_it, cfg))
            Holder(cfg)
            Box(cfg)
            something.unknown(cfg)


        def run_it(c):
            from pkg.ctl.worker import work

            work(c)
    """,
    "launch/stages.py": """
        def build(config):
            from pkg.data.x import use

            use(config)
    """,
    "ctl/__init__.py": "",
    "ctl/holder.py": """
        class Holder:
            def __init__(self, cfg):
                self.cfg = cfg

            def later(self):
                from pkg.launch.stages import build

                build(self.cfg)
    """,
    "ctl/worker.py": """
        def work(cfg):
            return None
    """,
    "data/__init__.py": "",
    "data/box.py": """
        from dataclasses import dataclass

        from pkg.config import Config


        @dataclass
        class Box:
            cfg: Config

            def go(self):
                from pkg.models import load

                load(self.cfg)
    """,
    "data/x.py": """
        from pkg.config import Config


        def use(cfg: "Config"):
            return cfg


        def unused(cfg: Config):
            return cfg
    """,
}


@pytest.fixture(scope="module")
def config_reach():
    """The script as a module, registered in ``sys.modules`` while it runs (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("config_reach", SCRIPTS / "config_reach.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_reach"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("config_reach", None)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text).lstrip())
    return root


def test_a_small_package_rooms_moves_and_back_moves(config_reach, package: Path) -> None:
    result = config_reach.reach(package, "pkg", "pkg.launch.local.train")
    assert result.rooms == ["launch", "config", "(root)", "ctl", "data"]
    kinds = {(m.callee, m.line): m.kind for m in result.moves}
    assert kinds == {
        ("pkg.config.tree.with_values", 12): "new",  # through the re-export of pkg.config
        ("pkg.launch.stages.build", 13): "within",  # a relative import
        ("pkg.models.load", 14): "new",  # models.load(cfg.trainer) passes a section: no move
        ("pkg.launch.local.run_it", 17): "within",  # handed to asyncio.to_thread with the config
        ("pkg.ctl.holder.Holder.__init__", 18): "new",
        ("pkg.data.box.Box", 19): "new",  # a dataclass: the config fills its field
        ("pkg.data.x.use", 4): "back",  # from build, data entered by Box
        ("pkg.ctl.worker.work", 26): "back",  # run_it's parameter is named c
        ("pkg.launch.stages.build", 8): "back",  # Holder.later passes self.cfg
        ("pkg.models.load", 13): "back",  # Box.go passes its field
    }
    assert result.counts() == {"rooms": 5, "moves": 10, "within": 2, "new_room": 4, "back": 4, "unresolved": 1}
    via = {m.callee: m.via for m in result.moves}
    assert via["pkg.launch.local.run_it"] == "asyncio.to_thread" and via["pkg.launch.stages.build"] == ""
    (unresolved,) = result.unresolved
    assert unresolved["call"] == "something.unknown" and unresolved["caller"] == "pkg.launch.local.train"
    assert result.holding_classes == {"pkg.ctl.holder.Holder": ["cfg"], "pkg.data.box.Box": ["cfg"]}


def test_functions_outside_launch_that_take_the_config(config_reach, package: Path) -> None:
    takes = {
        t["function"]: t["reached"] for t in config_reach.reach(package, "pkg", "pkg.launch.local.train").takes_config
    }
    assert takes == {
        "pkg.config.tree.with_values": True,
        "pkg.ctl.holder.Holder.__init__": True,
        "pkg.ctl.worker.work": True,
        "pkg.data.box.Box": True,
        "pkg.data.x.use": True,
        "pkg.data.x.unused": False,  # annotated Config, never passed the config
        "pkg.models.load": True,
    }


def test_a_section_passed_on_is_not_followed(config_reach, package: Path) -> None:
    (package / "launch" / "local.py").write_text(
        "from pkg import models\n\n\ndef train(cfg):\n    models.load(cfg.trainer)\n"
    )
    result = config_reach.reach(package, "pkg", "pkg.launch.local.train")
    assert result.moves == [] and result.rooms == ["launch"]


def test_the_repository_tree(config_reach, capsys: pytest.CaptureFixture[str]) -> None:
    """Facts of this repository's tree: the whole config stops at ``launch/`` (DESIGN: each stage receives its
    own section and ready parts) apart from the config package's own functions; the engine gets it from the
    launcher, every move's caller is reached from ``train`` itself, and ``--json`` prints what the table counts."""
    result = config_reach.reach()
    callees = {m.callee for m in result.moves}
    assert "asyncrl.launch.stages.build_engine" in callees
    assert result.rooms == ["launch", "config"]
    holders = tuple(f"{cls}." for cls in result.holding_classes)
    assert all(
        m.caller == config_reach.START or m.caller in callees or m.caller.startswith(holders) for m in result.moves
    )
    counts = result.counts()
    assert counts["moves"] == counts["within"] + counts["new_room"] + counts["back"]
    assert counts["new_room"] == counts["rooms"] - 1
    assert config_reach.main(["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["counts"] == counts and printed["rooms"] == result.rooms
    assert all(not t["function"].startswith("asyncrl.launch.") for t in printed["takes_config_outside_launch"])
    reached = [t["function"] for t in printed["takes_config_outside_launch"] if t["reached"]]
    assert reached and all(f.startswith("asyncrl.config.") for f in reached)


def test_a_classmethod_gets_the_config_in_its_second_parameter(config_reach, package: Path) -> None:
    (package / "ctl" / "maker.py").write_text(
        "from pkg.ctl.worker import work\n\n\nclass Maker:\n    @classmethod\n    def make(cls, c):\n        work(c)\n"
    )
    (package / "launch" / "local.py").write_text(
        "from pkg.ctl.maker import Maker\n\n\ndef train(cfg):\n    Maker.make(cfg)\n"
    )
    result = config_reach.reach(package, "pkg", "pkg.launch.local.train")
    assert [(m.callee, m.kind) for m in result.moves] == [
        ("pkg.ctl.maker.Maker.make", "new"),
        ("pkg.ctl.worker.work", "within"),
    ]
