"""The algorithm library (DESIGN §5): advantages and losses as pure tensor functions.

Owns nothing stateful: every function maps tensors to tensors (torch only, no sibling imports but
the ``Literal`` aliases of ``asyncrl.choices`` that type the choices, e.g. ``LossType``).
- :mod:`asyncrl.algo.advantages`: GRPO / Dr.GRPO / RLOO / REINFORCE++ group estimators, batch
  normalisation, GAE, dynamic-sampling and overlong-penalty helpers.
- :mod:`asyncrl.algo.losses`: the decoupled PPO policy loss (with GSPO, CISPO and uncorrected
  policy-gradient variants) and the clipped value loss.
- :mod:`asyncrl.algo.corrections`: off-policy token masks (version gap, M2PO second moment).
- :mod:`asyncrl.algo.logprobs`: KL penalties, entropy, the log-linear proximal approximation.
- :mod:`asyncrl.algo.aggregation`: token/sequence aggregation with a global denominator.
"""

from asyncrl.algo.advantages import (
    compute_advantages,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    informative_groups,
    normalize_batch,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)
from asyncrl.algo.aggregation import Segments, aggregate_loss
from asyncrl.algo.corrections import m2_keep, version_gap_keep
from asyncrl.algo.logprobs import entropy_from_logits, kl_penalty, loglinear_prox_logp
from asyncrl.algo.losses import policy_loss, value_loss

__all__ = [
    "Segments",
    "aggregate_loss",
    "compute_advantages",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "informative_groups",
    "kl_penalty",
    "loglinear_prox_logp",
    "m2_keep",
    "normalize_batch",
    "overlong_penalty",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "value_loss",
    "version_gap_keep",
]
