"""DQN and categorical DQN (C51): TorchRL's ``DQNLoss``/``DistributionalDQNLoss`` maths, wired for tdrl's replay.

DQN runs as :class:`FusedDQNLoss`, ``DQNLoss``'s values and gradients (tested) with the online network called
directly instead of through parameter swaps. tdrl adds the glue TorchRL's losses lack:

* **n-step bootstrap discount**: ``gamma ** steps_to_next_obs`` per sample (:mod:`tdrl.objectives.terms`).
* **Importance-sampling weights** of prioritized replay, read from ``priority_weight`` and reduced as TorchRL does
  (``sum(w l) / sum(w)``; rlpyt's ``mean(w l)`` with max-normalised ``w`` differs by a per-batch scale).
* **Priorities** in rlpyt's units (:func:`dqn_priorities`): ``|delta|`` clipped to ``delta_clip``, not the squared
  error TorchRL writes as ``td_error`` (which would square the PER exponent). C51: the per-sample cross-entropy.

``"huber"`` is Huber with delta 1 (rlpyt's ``delta_clip=1``), ``"mse"`` the squared error. Target updates are the
caller's (``tdrl.objectives.update.TargetUpdate``, counted in gradient updates as rlpyt does).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch.nn import functional as F
from torchrl.modules import DistributionalQValueActor, QValueActor
from torchrl.objectives import DistributionalDQNLoss, DQNLoss, LossModule, ValueEstimators

from tdrl.objectives.terms import STEPS_KEY, WEIGHT_KEY, td0_target, weighted_mean

__all__ = ["FusedDQNLoss", "dqn_priorities", "make_dqn_loss"]

_LOSS_FUNCTIONS = {"huber": "smooth_l1", "mse": "l2"}


class FusedDQNLoss(LossModule):
    """``DQNLoss`` (TD(0) target with ``gamma ** steps``, optional double DQN, Huber or squared error, PER-weighted
    mean, squared TD error written as ``td_error``) on plain tensors: the online network and its copy
    ``target_q_net`` (updated by ``TargetUpdate``) are called directly, without parameter swaps.

    Args:
        q_actor: ``QValueActor`` from :func:`tdrl.models.q.make_q_actor` (``n_atoms == 1``), integer actions.
        gamma, double_dqn, loss_function, steps_key, weight_key: see :func:`make_dqn_loss`.
    """

    out_keys = ["loss"]

    def __init__(
        self,
        q_actor: QValueActor,
        *,
        gamma: float = 0.99,
        double_dqn: bool = False,
        loss_function: Literal["huber", "mse"] = "huber",
        steps_key: NestedKey = STEPS_KEY,
        weight_key: NestedKey = WEIGHT_KEY,
    ) -> None:
        super().__init__()
        if not isinstance(q_actor, QValueActor):
            raise ValueError(f"FusedDQNLoss needs a QValueActor (make_q_actor), got {type(q_actor).__name__}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.register_buffer("gamma", torch.tensor(float(gamma)))
        self.steps_key, self.weight_key = steps_key, weight_key
        self.value_network = q_actor
        self.q_net = q_actor[0].module  # observation -> action values [..., n_actions]
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self.double_dqn = double_dqn
        self.huber = loss_function == "huber"

    def forward(self, sample: TensorDictBase) -> TensorDict:
        next_obs = sample.get(("next", "observation"))
        reward = sample.get(("next", "reward")).reshape(sample.batch_size)
        action = sample.get("action").long().unsqueeze(-1)
        q_sa = self.q_net(sample.get("observation")).gather(-1, action).squeeze(-1)
        with torch.no_grad():
            q_next = self.target_q_net(next_obs)
            if self.double_dqn:
                bootstrap = q_next.gather(-1, self.q_net(next_obs).argmax(-1, keepdim=True)).squeeze(-1)
            else:
                bootstrap = q_next.max(-1).values
            target = td0_target(sample, reward, bootstrap, self.gamma, self.steps_key)
        per_sample = F.smooth_l1_loss(q_sa, target, reduction="none") if self.huber else (q_sa - target).pow(2)
        sample.set("td_error", (q_sa - target).detach().pow(2))
        return TensorDict(loss=weighted_mean(per_sample, sample, self.weight_key))


def make_dqn_loss(
    q_actor: torch.nn.Module,
    *,
    gamma: float = 0.99,
    double_dqn: bool = False,
    loss_function: Literal["huber", "mse"] = "huber",
    steps_key: NestedKey = STEPS_KEY,
    weight_key: NestedKey = WEIGHT_KEY,
    fused: bool = True,
) -> FusedDQNLoss | DQNLoss | DistributionalDQNLoss:
    """The DQN loss for a Q actor from :func:`tdrl.models.q.make_q_actor`, categorical when the actor is.

    Args:
        q_actor: ``QValueActor`` (DQN) or ``DistributionalQValueActor`` (C51).
        gamma: discount per env step (the n-step bootstrap uses ``gamma ** steps``).
        double_dqn: select the bootstrap action with the online network, evaluate it with the target network.
            TorchRL's categorical loss always does this, so C51 requires ``double_dqn=True``.
        loss_function: ``"huber"`` (delta 1, rlpyt's ``delta_clip=1``) or ``"mse"``. C51 uses cross-entropy.
        steps_key: key of the per-sample step count to the bootstrap observation (absent: one step).
        weight_key: key of the PER importance weights (absent: unweighted mean).
        fused: DQN as :class:`FusedDQNLoss`; ``False`` gives TorchRL's ``DQNLoss`` (the reference it is tested and
            timed against). C51 is always TorchRL's.

    Returns:
        :class:`FusedDQNLoss` or TorchRL's ``DQNLoss`` (DQN), TorchRL's ``DistributionalDQNLoss`` (C51), each with
        a target network.
        Calling it on a sample returns ``{"loss": ...}`` and writes the per-sample ``td_error`` into the sample
        (see :func:`dqn_priorities`).

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
    if fused:
        return FusedDQNLoss(q_actor, gamma=gamma, double_dqn=double_dqn, loss_function=loss_function,
                            steps_key=steps_key, weight_key=weight_key)
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
