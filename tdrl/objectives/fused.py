"""What tdrl's plain-tensor losses (``FusedDQNLoss``, ``FusedSACLoss``, ``FusedTD3Loss``) share.

Each computes a TorchRL loss's terms directly on tensors (tested equal in values and gradients) instead of swapping
parameter TensorDicts into modules. They read the same replay-sample keys, build the same TD(0) target
(``gamma ** steps_to_next_obs`` per sample; ``terminated`` stops the bootstrap, ``truncated`` does not) and reduce
with the same PER-weighted mean as TorchRL (``sum(w * l) / sum(w)``). :class:`TwinCriticLoss` adds the stacked
critics of SAC and TD3: a :class:`~tdrl.models.q.TwinQ` evaluated with online, target or detached parameter lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torchrl.objectives import LossModule

from tdrl.models.q import TwinQ

__all__ = ["STEPS_KEY", "WEIGHT_KEY", "FusedLoss", "ReplaySampleKeys", "TwinCriticLoss"]

STEPS_KEY: NestedKey = "steps_to_next_obs"
"""Default key of the per-sample number of steps to the bootstrap observation (TorchRL's ``MultiStep`` key)."""
WEIGHT_KEY: NestedKey = "priority_weight"
"""Default key of prioritized replay's importance-sampling weights (tdrl's replay and TorchRL's losses use it)."""


@dataclass
class ReplaySampleKeys:
    """Keys tdrl's plain-tensor losses read from a replay sample (``reward`` and ``terminated`` under ``"next"``);
    ``priority`` is written. TorchRL's ``set_keys`` renames them."""

    observation: NestedKey = "observation"
    action: NestedKey = "action"
    reward: NestedKey = "reward"
    terminated: NestedKey = "terminated"
    steps_to_next_obs: NestedKey = STEPS_KEY
    priority_weight: NestedKey = WEIGHT_KEY
    priority: NestedKey = "td_error"


class FusedLoss(LossModule):
    """Base of the plain-tensor losses: sample keys, ``gamma``, the TD(0) target and the PER-weighted mean.

    Args:
        gamma: discount per env step.
        steps_key: key of the per-sample steps to the bootstrap observation.
        weight_key: key of the PER importance weights.

    Raises:
        ValueError: ``gamma`` outside [0, 1].
    """

    _AcceptedKeys = ReplaySampleKeys
    default_keys = ReplaySampleKeys
    tensor_keys: ReplaySampleKeys

    def __init__(self, *, gamma: float, steps_key: NestedKey, weight_key: NestedKey) -> None:
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.register_buffer("gamma", torch.tensor(float(gamma)))
        self.set_keys(steps_to_next_obs=steps_key, priority_weight=weight_key)

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass  # the TD(0) target is computed here; there is no separate value estimator

    def td0_target(self, tensordict: TensorDictBase, reward: torch.Tensor, next_value: torch.Tensor) -> torch.Tensor:
        """``reward + gamma ** steps * (1 - terminated) * next_value``, shaped like ``reward``."""
        keys = self.tensor_keys
        terminated = tensordict.get(("next", keys.terminated)).reshape(reward.shape)
        steps = tensordict.get(keys.steps_to_next_obs, None)
        discount = self.gamma if steps is None else self.gamma ** steps.reshape(reward.shape)
        return torch.where(terminated, reward, reward + discount * next_value)

    def weighted_mean(self, per_sample: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        """Mean over the batch, or TorchRL's ``sum(w * l) / sum(w)`` when the sample carries PER weights."""
        weights = tensordict.get(self.tensor_keys.priority_weight, None)
        if weights is None:
            return per_sample.mean()
        weights = weights.reshape(per_sample.shape)
        return (per_sample * weights).sum() / weights.sum()


class TwinCriticLoss(FusedLoss):
    """A :class:`FusedLoss` with stacked critics and their polyak targets (``target_qvalue_network_params``, driven
    by TorchRL's ``SoftUpdate`` through :class:`tdrl.objectives.update.TargetUpdate`).

    Raises:
        ValueError: a critic that is not a ``TwinQ`` (``make_twin_q``), or a bad ``gamma``.
    """

    def __init__(self, critic: TwinQ, *, gamma: float, steps_key: NestedKey, weight_key: NestedKey) -> None:
        if not isinstance(critic, TwinQ):
            raise ValueError(f"{type(self).__name__} needs a TwinQ critic (make_twin_q), got {type(critic).__name__}")
        super().__init__(gamma=gamma, steps_key=steps_key, weight_key=weight_key)
        self.qvalue_network = critic
        self.qvalue_network_params = TensorDictParams(TensorDict.from_module(critic), no_convert=True)
        self.target_qvalue_network_params = TensorDictParams(self.qvalue_network_params.data.clone(),
                                                             no_convert=True)
        self._has_update_associated["qvalue_network"] = False
        self._param_keys = [(("weights", str(i)), ("biases", str(i))) for i in range(len(critic.weights))]
        self._params_read: dict[bool, list[torch.Tensor]] = {}

    def critic_params(self, target: bool = False) -> list[torch.Tensor]:
        """``[w0, b0, w1, b1, ...]`` of the online (or target) critics, the layout ``stacked_mlp`` takes.

        Read from the parameter TensorDicts once (~40 us a read here, three per update) and kept: optimizers, polyak
        updates and ``load_state_dict`` change these tensors in place; moving the module (``_apply``) reads again.
        """
        read = self._params_read.get(target)
        if read is None:
            params = self.target_qvalue_network_params if target else self.qvalue_network_params
            read = self._params_read[target] = [params.get(key) for pair in self._param_keys for key in pair]
        return read

    def _apply(self, *args, **kwargs):
        self._params_read = {}
        return super()._apply(*args, **kwargs)
