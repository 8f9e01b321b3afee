"""DQN and categorical DQN (C51) on TorchRL's loss modules, wired for tdrl's replay samples.

TorchRL's ``DQNLoss`` (target network, double DQN, Huber/MSE, TD(0) with per-sample ``gamma ** steps``) and
``DistributionalDQNLoss`` (C51 projection, per-sample ``gamma ** steps``) do the maths. tdrl adds the glue they
lack:

* **n-step bootstrap discount.** An n-step replay sample carries the discounted n-step reward sum in
  ``("next", "reward")``, the observation at the window's end in ``("next", "observation")`` and the number of
  steps to it in ``steps_key`` (fewer than n where the episode ended inside the window; ``terminated`` then stops
  the bootstrap). The losses are pointed at that key, so the bootstrap is ``gamma ** steps`` per sample.
* **Importance-sampling weights** of prioritized replay are read from ``weight_key`` (``priority_weight``).
  TorchRL reduces weighted losses as ``sum(w * l) / sum(w)`` (self-normalised), rlpyt as ``mean(w * l)`` with
  ``w`` max-normalised; both are proportional per batch, so they differ only by a per-batch learning-rate scale.
* **Priorities** in rlpyt's units (:func:`dqn_priorities`): TorchRL writes the *squared* TD error as ``td_error``;
  rlpyt prioritises by ``|delta|`` clipped to ``delta_clip``. Feeding the squared error would silently square the
  PER exponent (alpha 0.6 -> 1.2). For C51 the priority is the per-sample cross-entropy TorchRL writes (as in
  Hessel et al.'s reference implementation).

Loss names follow rlpyt's ``delta_clip``: ``"huber"`` is the Huber loss with delta 1 (rlpyt's default
``delta_clip=1``; ``smooth_l1`` is exactly that), ``"mse"`` the squared error (rlpyt ``delta_clip=None``).

Target updates are the caller's (``tdrl.objectives.update.TargetUpdate``): rlpyt counts
``target_update_interval`` in gradient updates.
"""

from __future__ import annotations

from typing import Literal

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.modules import DistributionalQValueActor
from torchrl.objectives import DistributionalDQNLoss, DQNLoss, ValueEstimators

__all__ = ["STEPS_KEY", "WEIGHT_KEY", "dqn_priorities", "make_dqn_loss"]

STEPS_KEY: NestedKey = "steps_to_next_obs"
"""Default key of the per-sample number of steps to the bootstrap observation (TorchRL's ``MultiStep`` key)."""
WEIGHT_KEY: NestedKey = "priority_weight"
"""Default key of prioritized replay's importance-sampling weights (tdrl's replay and TorchRL's losses use it)."""

_LOSS_FUNCTIONS = {"huber": "smooth_l1", "mse": "l2"}


def make_dqn_loss(
    q_actor: torch.nn.Module,
    *,
    gamma: float = 0.99,
    double_dqn: bool = False,
    loss_function: Literal["huber", "mse"] = "huber",
    steps_key: NestedKey = STEPS_KEY,
    weight_key: NestedKey = WEIGHT_KEY,
) -> DQNLoss | DistributionalDQNLoss:
    """The DQN loss for a Q actor from :func:`tdrl.models.q.make_q_actor`, categorical when the actor is.

    Args:
        q_actor: ``QValueActor`` (DQN) or ``DistributionalQValueActor`` (C51).
        gamma: discount per env step (the n-step bootstrap uses ``gamma ** steps``).
        double_dqn: select the bootstrap action with the online network, evaluate it with the target network.
            TorchRL's categorical loss always does this, so C51 requires ``double_dqn=True``.
        loss_function: ``"huber"`` (delta 1, rlpyt's ``delta_clip=1``) or ``"mse"``. C51 uses cross-entropy.
        steps_key: key of the per-sample step count to the bootstrap observation (absent: one step).
        weight_key: key of the PER importance weights (absent: unweighted mean).

    Returns:
        The TorchRL loss with a target network. Calling it on a sample returns ``{"loss": ...}`` and writes the
        per-sample ``td_error`` into the sample (see :func:`dqn_priorities`).

    Raises:
        ValueError: unknown ``loss_function``, or C51 with ``double_dqn=False``.
    """
    if loss_function not in _LOSS_FUNCTIONS:
        raise ValueError(f"loss_function must be one of {sorted(_LOSS_FUNCTIONS)}, got {loss_function!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if isinstance(q_actor, DistributionalQValueActor):
        if not double_dqn:
            raise ValueError(
                "categorical DQN here is TorchRL's DistributionalDQNLoss, which always selects the bootstrap action "
                "with the online network (double DQN); set double_dqn=True"
            )
        loss = DistributionalDQNLoss(q_actor, gamma=gamma, delay_value=True)
        loss.set_keys(steps_to_next_obs=steps_key, priority_weight=weight_key)
        return loss
    loss = DQNLoss(
        q_actor,
        loss_function=_LOSS_FUNCTIONS[loss_function],
        delay_value=True,
        double_dqn=double_dqn,
        action_space=q_actor.spec["action"] if hasattr(q_actor.spec, "keys") else q_actor.spec,
    )
    loss.set_keys(priority_weight=weight_key)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
    loss.value_estimator.set_keys(steps_to_next_obs=steps_key)
    return loss


def dqn_priorities(sample: TensorDictBase, *, categorical: bool, delta_clip: float | None = 1.0) -> torch.Tensor:
    """New PER priorities ``[batch]`` for a sample the loss has just seen.

    DQN: ``|delta|`` (TorchRL stores ``delta ** 2`` as ``td_error``), clipped to ``delta_clip`` as in rlpyt (the
    Huber loss's gradient is clipped there too). C51: the per-sample cross-entropy.

    Raises:
        KeyError: the loss has not been called on ``sample`` (no ``td_error``).
    """
    td_error = sample.get("td_error", None)
    if td_error is None:
        raise KeyError("sample has no 'td_error': call the loss on this sample before computing priorities")
    td_error = td_error.detach().reshape(sample.batch_size)
    if categorical:
        return td_error
    abs_error = td_error.sqrt()
    return abs_error.clamp(max=delta_clip) if delta_clip is not None else abs_error
