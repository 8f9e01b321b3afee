"""DQN and categorical DQN (C51) on TorchRL's loss modules, wired for tdrl's replay samples.

TorchRL's ``DQNLoss`` (target network, double DQN, Huber/MSE, TD(0) with per-sample ``gamma ** steps``) and
``DistributionalDQNLoss`` (C51 projection, per-sample ``gamma ** steps``) define the maths; DQN runs it as
:class:`FusedDQNLoss`, the same values and gradients on plain tensors, 1.5x faster per update. tdrl adds the glue they
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
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torch.nn import functional as F
from torchrl.modules import DistributionalQValueActor, QValueActor
from torchrl.objectives import DistributionalDQNLoss, DQNLoss, ValueEstimators

from tdrl.objectives.fused import STEPS_KEY, WEIGHT_KEY, FusedLoss, ReplaySampleKeys

__all__ = ["STEPS_KEY", "WEIGHT_KEY", "FusedDQNLoss", "dqn_priorities", "ReplaySampleKeys", "make_dqn_loss"]

_LOSS_FUNCTIONS = {"huber": "smooth_l1", "mse": "l2"}


class FusedDQNLoss(FusedLoss):
    """TorchRL's ``DQNLoss`` (TD(0) target with ``gamma ** steps``, optional double DQN, Huber or squared error,
    PER-weighted mean, squared TD error written as ``td_error``) computed on plain tensors.

    ``DQNLoss`` swaps parameter TensorDicts into the network for each of its three Q evaluations and builds
    TensorDicts around every output; with CartPole-sized nets that machinery is a third of an update (one
    double-DQN update, dueling [256, 256], batch 64, fused Adam: 2.5 ms against 1.65 ms here;
    ``benchmarks/learning.py --dqn-loss``). The online network is called directly on its own parameters; only the
    target evaluation swaps in ``target_value_network_params``, which TorchRL's ``HardUpdate``/``SoftUpdate``
    (:class:`tdrl.objectives.update.TargetUpdate`) drive as for ``DQNLoss``. Values and gradients equal
    ``DQNLoss`` (tested).

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
        super().__init__(gamma=gamma, steps_key=steps_key, weight_key=weight_key)
        if not isinstance(q_actor, QValueActor):
            raise ValueError(f"FusedDQNLoss needs a QValueActor (make_q_actor), got {type(q_actor).__name__}")
        self.value_network = q_actor
        self.q_net = q_actor[0].module  # observation -> action values [..., n_actions]
        self.value_network_params = TensorDictParams(TensorDict.from_module(q_actor), no_convert=True)
        self.target_value_network_params = TensorDictParams(self.value_network_params.data.clone(), no_convert=True)
        self._has_update_associated["value_network"] = False
        self.double_dqn = double_dqn
        self.huber = loss_function == "huber"

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        keys = self.tensor_keys
        next_obs = tensordict.get(("next", keys.observation))
        reward = tensordict.get(("next", keys.reward)).reshape(tensordict.batch_size)
        action = tensordict.get(keys.action).long().unsqueeze(-1)
        q_sa = self.q_net(tensordict.get(keys.observation)).gather(-1, action).squeeze(-1)
        with torch.no_grad():
            with self.target_value_network_params.to_module(self.value_network):
                q_next = self.q_net(next_obs)
            if self.double_dqn:
                bootstrap = q_next.gather(-1, self.q_net(next_obs).argmax(-1, keepdim=True)).squeeze(-1)
            else:
                bootstrap = q_next.max(-1).values
            target = self.td0_target(tensordict, reward, bootstrap)
        per_sample = F.smooth_l1_loss(q_sa, target, reduction="none") if self.huber else (q_sa - target).pow(2)
        tensordict.set(keys.priority, (q_sa - target).detach().pow(2))
        return TensorDict(loss=self.weighted_mean(per_sample, tensordict))


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
