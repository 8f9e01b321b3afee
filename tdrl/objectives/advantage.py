"""GAE on ``[B, T]`` collector batches with one critic forward, on TorchRL's kernels.

TorchRL's ``GAE`` module calls the critic twice through its generic value-network machinery (parameter swaps,
optional vmap), which costs more than a small MLP. Semantics are TorchRL's (and rlpyt's ``*_tl`` variants):
``("next", "done")`` cuts the trace, ``("next", "terminated")`` drops the bootstrap value, and a time-limit
``truncated`` step bootstraps from the critic's value of the true final observation in ``("next", "observation")``.
Recurrent critics are evaluated step-wise from the stored states, as during collection (``("recurrent_state", ...)``
and the policy-written ``("next", "recurrent_state", ...)``).

Keys read: the critic's ``in_keys`` at the root and under ``"next"``, ``("next", "reward"|"done"|"terminated")``.
Keys written: ``state_value``, ``advantage``, ``value_target``, each ``[B, T, 1]``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

__all__ = ["GAE"]

_VECTORISE_FROM_T = 32  # the python recursion is faster on short batches, the vectorised one on long ones


class GAE:
    """Generalised advantage estimation for ``[B, T]`` batches (time last).

    Args:
        critic: TensorDict module writing ``state_value`` from its ``in_keys`` (``ValueOperator`` or an LSTM
            critic); evaluated once on observations and next observations together, without gradients.
        gamma: discount.
        lmbda: GAE lambda (1.0: the discounted return bootstrapped with ``V(s_T)``, rlpyt's ``discount_return``).
    """

    def __init__(self, critic: TensorDictModuleBase, *, gamma: float, lmbda: float) -> None:
        if not 0.0 <= gamma <= 1.0 or not 0.0 <= lmbda <= 1.0:
            raise ValueError(f"gamma and lmbda must be in [0, 1], got {gamma}, {lmbda}")
        self.critic, self.gamma, self.lmbda = critic, float(gamma), float(lmbda)
        self.in_keys = list(critic.in_keys)

    @torch.no_grad()
    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        if batch.ndim != 2:
            raise ValueError(f"GAE expects a [B, T] batch, got batch_size {tuple(batch.batch_size)}")
        n_envs = batch.shape[0]
        nxt = batch.get("next")
        if "is_init" in self.in_keys and "is_init" not in nxt.keys():
            nxt.set("is_init", torch.zeros_like(batch.get("is_init")))  # a next state continues its episode
        both = torch.cat([batch.select(*self.in_keys), nxt.select(*self.in_keys)], dim=0)
        values = self.critic(both).get("state_value")
        value, next_value = values[:n_envs], values[n_envs:]
        kernel = vec_generalized_advantage_estimate if batch.shape[1] >= _VECTORISE_FROM_T \
            else generalized_advantage_estimate
        advantage, target = kernel(self.gamma, self.lmbda, value, next_value, nxt.get("reward"), nxt.get("done"),
                                   nxt.get("terminated"), time_dim=-2)
        batch.set("state_value", value)
        batch.set("advantage", advantage)
        batch.set("value_target", target)
        return batch
