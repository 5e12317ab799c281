"""Cross-field checks of the config's off-policy settings (``algo.*`` corrections, ``controller.fixed_lag``).

Split out of :mod:`asyncrl.config` (which calls them from ``validate``) to keep that module small.
Like it: no torch, no sibling but ``config_parse``; each error names the key and what is allowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl.config_parse import ConfigError

if TYPE_CHECKING:
    from asyncrl.config import Config

__all__ = ["validate_algo", "validate_fixed_lag"]


def validate_algo(cfg: Config) -> None:
    """The off-policy corrections, the KL penalty and the overlong penalty (``algo.*``)."""
    a = cfg.algo
    if a.max_version_gap is not None and a.max_version_gap < 0:
        raise ConfigError(f"algo.max_version_gap must be >= 0 or null, got {a.max_version_gap}")
    if a.m2_threshold is not None:
        if a.m2_threshold < 0:
            raise ConfigError(f"algo.m2_threshold must be >= 0 or null, got {a.m2_threshold}")
        if a.prox_mode != "recompute":
            raise ConfigError(
                f"algo.m2_threshold needs algo.prox_mode=recompute (the mask is computed from the recomputed "
                f"proximal log-probs), got prox_mode={a.prox_mode}"
            )
    if a.kl_coef < 0:
        raise ConfigError(f"algo.kl_coef must be >= 0 (0: off), got {a.kl_coef}")
    if not 0 <= a.overlong_buffer <= cfg.rollout.max_new_tokens or a.overlong_penalty < 0:
        raise ConfigError(
            f"algo.overlong_buffer must be in [0, rollout.max_new_tokens={cfg.rollout.max_new_tokens}] (0: off) "
            f"and algo.overlong_penalty >= 0, got {a.overlong_buffer} and {a.overlong_penalty}"
        )
    if a.dual_clip is not None and a.loss_type in ("cispo", "pg"):
        raise ConfigError(f"algo.dual_clip does not apply to algo.loss_type={a.loss_type} (set it to null)")


def validate_fixed_lag(cfg: Config) -> None:
    """``controller.fixed_lag``: a lag k >= 0 that the staleness bound allows, on the setups that hold
    a ring of in-process weight snapshots."""
    k = cfg.controller.fixed_lag
    if k is None:
        return
    if k < 0:
        raise ConfigError(f"controller.fixed_lag must be >= 0 or null, got {k}")
    if cfg.controller.max_staleness < k:
        raise ConfigError(
            f"controller.fixed_lag={k} needs controller.max_staleness >= {k} (the bound the batcher checks), "
            f"got {cfg.controller.max_staleness}"
        )
    if cfg.trainer.weight_transport != "tensors" or cfg.launch.kind != "local" or cfg.launch.engine_urls:
        raise ConfigError(
            "controller.fixed_lag needs trainer.weight_transport=tensors and launch.kind=local without "
            "launch.engine_urls (it keeps the last k exports in memory)"
        )
    if cfg.controller.eval_every:
        raise ConfigError(
            "controller.fixed_lag needs controller.eval_every=0 (an evaluation between steps would swap the "
            "engine's weights while the next batch generates)"
        )
