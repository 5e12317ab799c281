"""Custom reward functions: loading by name and checking what they return."""

from __future__ import annotations

import math
import sys
import types

import pytest

from asyncrl.reward.custom import call_custom_reward, load_custom_reward, to_reward


def test_load_by_name() -> None:
    assert load_custom_reward("math:sqrt") is math.sqrt
    assert load_custom_reward("asyncrl.reward.custom:to_reward") is to_reward
    assert load_custom_reward("collections:OrderedDict.fromkeys") is not None


@pytest.mark.parametrize("spec", ["", "math", "math:", ":sqrt", "math:sqrt:x", "math sqrt", "1mod:f"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        load_custom_reward(spec)


def test_missing_and_not_callable() -> None:
    with pytest.raises(ModuleNotFoundError):
        load_custom_reward("no_such_module_xyz:f")
    with pytest.raises(AttributeError):
        load_custom_reward("math:no_such_function")
    with pytest.raises(TypeError):
        load_custom_reward("math:pi")


def test_to_reward() -> None:
    assert to_reward(True) == 1.0 and to_reward(0) == 0.0 and to_reward(0.25) == 0.25
    for bad in ("1", None, [1], float("nan"), float("inf")):
        with pytest.raises((TypeError, ValueError)):
            to_reward(bad)


def test_call_passes_prompt_completion_row(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, dict]] = []

    def fn(prompt: str, completion: str, row: dict) -> float:
        seen.append((prompt, completion, row))
        return 0.75

    async def afn(prompt: str, completion: str, row: dict) -> bool:
        return True

    module = types.ModuleType("asyncrl_test_custom_inline")
    module.fn = fn  # type: ignore[attr-defined]
    module.afn = afn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "asyncrl_test_custom_inline", module)
    assert call_custom_reward("asyncrl_test_custom_inline:fn", "P", "C", {"k": 1}) == 0.75
    assert seen == [("P", "C", {"k": 1})]
    assert call_custom_reward("asyncrl_test_custom_inline:afn", "P", "C", {}) == 1.0
