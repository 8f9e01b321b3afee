"""The replay-sample terms tdrl's plain-tensor losses share with TorchRL's: the TD(0) target and the PER mean.

An n-step sample carries the discounted reward sum in ``("next", "reward")``, the bootstrap observation in
``("next", "observation")`` and the steps to it in ``steps_to_next_obs`` (TorchRL's ``MultiStep`` key), so the
bootstrap is ``gamma ** steps``; ``terminated`` stops it, a time-limit ``truncated`` does not. PER importance
weights (``priority_weight``) reduce as TorchRL does: ``sum(w * l) / sum(w)``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from tdrl.utils.keys import STEPS_KEY, WEIGHT_KEY

__all__ = ["check_gamma", "td0_target", "weighted_mean"]



def check_gamma(gamma: float) -> torch.Tensor:
    """``gamma`` as a tensor (a loss's ``gamma`` buffer), after checking it is a discount in [0, 1]."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    return torch.tensor(float(gamma))


def td0_target(sample: TensorDictBase, reward: torch.Tensor, next_value: torch.Tensor,
               gamma: torch.Tensor) -> torch.Tensor:
    """``reward + gamma ** steps * (1 - terminated) * next_value``, shaped like ``reward``."""
    terminated = sample.get(("next", "terminated")).reshape(reward.shape)
    steps = sample.get(STEPS_KEY, None)
    discount = gamma if steps is None else gamma ** steps.reshape(reward.shape)
    return torch.where(terminated, reward, reward + discount * next_value)


def weighted_mean(per_sample: torch.Tensor, sample: TensorDictBase) -> torch.Tensor:
    """Mean over the batch, or TorchRL's ``sum(w * l) / sum(w)`` when the sample carries PER weights."""
    weights = sample.get(WEIGHT_KEY, None)
    if weights is None:
        return per_sample.mean()
    weights = weights.reshape(per_sample.shape)
    return (per_sample * weights).sum() / weights.sum()
