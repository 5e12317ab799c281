"""A Tinker-compatible training service over the project's trainer parts and engines (docs/tinker.md).

Researchers who write their loops against Tinker's small training API (``forward_backward``,
``optim_step``, ``save_weights_for_sampler``, ``sample``) point the official ``tinker`` client's
``base_url`` at ``asyncrl serve training`` and run unchanged. The package composes the stages: the
policy and LoRA adapters of :mod:`asyncrl.trainer`, the losses of :mod:`asyncrl.algo`, the engines of
:mod:`asyncrl.rollout` (weight updates in flight), the models of :mod:`asyncrl.models`, all on the one
HTTP stack :mod:`asyncrl.web`.

- :mod:`~asyncrl.service.server`: the server, a thread to run it in, the CLI's entry;
- :mod:`~asyncrl.service.routes`: the client's REST paths; :mod:`~asyncrl.service.schemas`: their bodies;
- :mod:`~asyncrl.service.core`: sessions, models, sampling sessions, the operations;
- :mod:`~asyncrl.service.model`: one trained model (LoRA or full), its optimizer and checkpoints;
- :mod:`~asyncrl.service.losses`: the client's loss names on :func:`asyncrl.algo.losses.policy_loss`;
- :mod:`~asyncrl.service.sampling`: live and snapshot engines; :mod:`~asyncrl.service.futures`: futures
  and the order of a model's requests; :mod:`~asyncrl.service.store`: checkpoints on disk;
  :mod:`~asyncrl.service.wire`: the protobuf messages of the client.
"""

from asyncrl.service.sampling import EngineSpec
from asyncrl.service.server import ServiceThread, TrainingServer, serve_training

__all__ = ["EngineSpec", "ServiceThread", "TrainingServer", "serve_training"]
