"""The off-policy keys of the config (``algo.*`` corrections, ``controller.fixed_lag``): defaults keep
today's behaviour, and each error names the key and what is allowed."""

from __future__ import annotations

import pytest

from asyncrl.config import Config, ConfigError, load_config


def test_defaults_are_off() -> None:
    a, c = Config().algo, Config().controller
    assert (a.max_version_gap, a.m2_threshold, a.kl_coef, a.overlong_buffer, c.fixed_lag) == (None, None, 0.0, 0, None)
    assert (a.loss_type, a.prox_mode, a.behav_cap, a.behav_cap_level) == ("ppo", "recompute", 5.0, "token")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.max_version_gap=-1"], "algo.max_version_gap must be >= 0"),
        (["algo.m2_threshold=-0.1"], "algo.m2_threshold must be >= 0"),
        (["algo.m2_threshold=0.04", "algo.prox_mode=behav"], "algo.m2_threshold needs algo.prox_mode=recompute"),
        (["algo.kl_coef=-1"], "algo.kl_coef must be >= 0"),
        (["algo.kl_estimator=k4"], "algo.kl_estimator: 'k4' is not one of k1, k2, k3"),
        (["algo.loss_type=reinforce"], "algo.loss_type: 'reinforce' is not one of ppo, gspo, cispo, pg"),
        (["algo.loss_type=pg", "algo.dual_clip=3"], "algo.dual_clip does not apply to algo.loss_type=pg"),
        (["algo.behav_weight=false"], "algo.behav_weight=false leaves the behaviour weight out, so algo.behav_cap=5.0"),
        (["controller.fixed_lag=-1"], "controller.fixed_lag must be >= 0"),
        (["controller.fixed_lag=8"], "controller.fixed_lag=8 needs controller.max_staleness >= 8"),
        (["controller.fixed_lag=1", "trainer.weight_transport=safetensors"], "trainer.weight_transport=tensors"),
        (["controller.fixed_lag=1", "controller.eval_every=2"], "controller.fixed_lag=1 needs controller.eval_every=0"),
    ],
)
def test_errors_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_valid_settings_load() -> None:
    cfg = load_config(
        None,
        [
            "algo.loss_type=pg",
            "algo.behav_cap=null",
            "controller.fixed_lag=4",
            "algo.m2_threshold=0.04",
            "algo.kl_coef=0.01",
        ],
    )
    assert cfg.controller.fixed_lag == 4 and cfg.algo.loss_type == "pg" and cfg.algo.behav_cap is None


def test_objective_arms_load() -> None:
    """The arms of ``python -m benchmarks objectives``: no behaviour weight, and the weight with no cap."""
    a = load_config(None, ["algo.behav_weight=false", "algo.behav_cap=null"]).algo
    assert (a.behav_weight, a.behav_cap, a.prox_mode) == (False, None, "recompute")
    assert Config().algo.behav_weight is True
    assert load_config(None, ["algo.behav_cap=null"]).algo.behav_weight is True
