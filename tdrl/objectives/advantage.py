"""GAE and V-trace on ``[B, T]`` collector batches with one critic forward, on TorchRL's kernels; and the reward
normaliser that may precede them (:class:`ReturnNorm`).

TorchRL's ``GAE`` module calls the critic twice through its generic value-network machinery (parameter swaps,
optional vmap), which costs more than a small MLP. TorchRL's ``VTrace`` module (torchrl 0.14) scores a fresh sample
of the current policy rather than the action taken, so its importance weight ``pi/mu`` compares two different
actions (``tests/objectives/test_advantage.py`` pins this); :class:`VTrace` here scores the stored ``action`` and
calls the same kernel, ``vtrace_advantage_estimate``. Semantics are TorchRL's (and rlpyt's ``*_tl`` variants):
``("next", "done")`` cuts the trace, ``("next", "terminated")`` drops the bootstrap value, and a time-limit
``truncated`` step bootstraps from the critic's value of the true final observation in ``("next", "observation")``.
Recurrent critics are evaluated step-wise from the stored states, as during collection (``("recurrent_state", ...)``
and the policy-written ``("next", "recurrent_state", ...)``).

Keys read: the critic's ``in_keys`` at the root and under ``"next"``, ``("next", "reward"|"done"|"terminated")``;
V-trace also the actor's inputs, ``action`` and the behaviour policy's ``action_log_prob``.
Keys written: ``state_value``, ``advantage``, ``value_target`` (V-trace also ``rho``), each ``[B, T, 1]``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
    vtrace_advantage_estimate,
)

from tdrl.models.nets import ObsNorm

__all__ = ["GAE", "ReturnNorm", "VTrace"]

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
        value, next_value = _state_values(self.critic, batch, "GAE")
        nxt = batch.get("next")
        kernel = vec_generalized_advantage_estimate if batch.shape[1] >= _VECTORISE_FROM_T \
            else generalized_advantage_estimate
        advantage, target = kernel(self.gamma, self.lmbda, value, next_value, nxt.get("reward"), nxt.get("done"),
                                   nxt.get("terminated"), time_dim=-2)
        batch.set("state_value", value)
        batch.set("advantage", advantage)
        batch.set("value_target", target)
        return batch


class ReturnNorm(nn.Module):
    """Divide rewards by the running standard deviation of the discounted return, then clip (Stable-Baselines3's
    ``VecNormalize(norm_reward=True)``; Engstrom et al. 2020, arXiv:2005.12729): value targets land near unit scale
    whatever the env's reward scale, and rewards keep their sign and their zero.

    Each env's discounted return ``R_t = gamma R_{t-1} + r_t`` restarts after ``("next", "done")``; every ``R_t`` of
    a batch joins the statistics before the batch's rewards are divided (SB3 folds each step in as it is taken). The
    statistics and the returns in progress are buffers, so a checkpoint of this module resumes them exactly.

    Args:
        n_envs: the batch's ``B`` (each env's return in progress carries over to its next batch).
        gamma: the discount of the return whose spread is measured (SB3: the algorithm's gamma).
        clip: bound on the normalised reward (SB3: 10).
    """

    running_return: torch.Tensor  # [B], float64

    def __init__(self, n_envs: int, *, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.gamma, self.clip, self.eps = float(gamma), float(clip), float(eps)
        self.stats = ObsNorm((), clip=float("inf"), eps=eps)
        self.register_buffer("running_return", torch.zeros(n_envs, dtype=torch.float64))

    @torch.no_grad()
    def forward(self, batch: TensorDictBase) -> TensorDictBase:
        """Normalise ``("next", "reward")`` of a ``[B, T]`` batch in place; returns the batch."""
        reward = batch.get(("next", "reward"))
        if batch.ndim != 2 or batch.shape[0] != self.running_return.shape[0]:
            raise ValueError(f"ReturnNorm for {self.running_return.shape[0]} envs expects a [B, T] batch with that B, "
                             f"got batch_size {tuple(batch.batch_size)}")
        flat_reward = reward.reshape(batch.shape).to(torch.float64)
        not_done = (~batch.get(("next", "done")).reshape(batch.shape)).to(torch.float64)
        returns = torch.empty_like(flat_reward)
        running = self.running_return  # a buffer: on the module's device, as the batch
        for t in range(batch.shape[1]):
            running = self.gamma * running + flat_reward[:, t]
            returns[:, t] = running
            running = running * not_done[:, t]
        self.running_return.copy_(running)
        self.stats.update(returns)
        scale = torch.rsqrt(self.stats.var + self.eps)
        batch.set(("next", "reward"), (reward * scale.to(reward.dtype)).clamp(-self.clip, self.clip))
        return batch


def _state_values(critic: TensorDictModuleBase, batch: TensorDictBase, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``V(s_t)`` and ``V(s_{t+1})`` of a ``[B, T]`` batch, ``[B, T, 1]`` each, from one critic call on both."""
    if batch.ndim != 2:
        raise ValueError(f"{who} expects a [B, T] batch, got batch_size {tuple(batch.batch_size)}")
    n_envs = batch.shape[0]
    nxt = batch.get("next")
    in_keys = list(critic.in_keys)
    if "is_init" in in_keys and "is_init" not in nxt.keys():
        nxt.set("is_init", torch.zeros_like(batch.get("is_init")))  # a next state continues its episode
    values = critic(torch.cat([batch.select(*in_keys), nxt.select(*in_keys)], dim=0)).get("state_value")
    return values[:n_envs], values[n_envs:]


class VTrace:
    """V-trace targets and advantages (Espeholt et al. 2018, arXiv:1802.01561) for ``[B, T]`` batches of unrolls
    collected by a behaviour policy ``mu``, which may lag the learner's ``pi``.

    With ``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))`` and ``c_t = min(c_bar, pi/mu)``, the target is
    ``v_s = V(x_s) + sum_t gamma^(t-s) (c_s ... c_{t-1}) rho_t (r_t + gamma V(x_{t+1}) - V(x_t))`` and the
    policy-gradient advantage ``rho_s (r_s + gamma v_{s+1} - V(x_s))``; on-policy (``pi = mu``, ``rho_bar, c_bar >=
    1``) the target is the discounted return bootstrapped with ``V(x_T)``. TorchRL's ``vtrace_advantage_estimate``
    computes both; ``pi(a_t|x_t)`` is the actor's probability of the stored ``action`` (recurrent actors: step-wise
    from the stored states, as during collection).

    Args:
        actor: the learner's probabilistic actor (``get_dist``), whose behaviour copies wrote ``log_prob_key``.
        critic: TensorDict module writing ``state_value`` (see :class:`GAE`).
        gamma: discount.
        rho_bar: clip of the importance weight in the TD errors (the fixed point's policy: 1.0 is ``pi`` itself).
        c_bar: clip of the trace-cutting weights (the contraction speed); the paper assumes ``c_bar <= rho_bar``.
        log_prob_key: the behaviour policy's ``log mu(a_t|x_t)`` in the batch.

    Writes ``state_value``, ``advantage``, ``value_target`` and ``rho`` (the clipped importance weight), all without
    gradients.
    """

    def __init__(self, actor: TensorDictModuleBase, critic: TensorDictModuleBase, *, gamma: float,
                 rho_bar: float = 1.0, c_bar: float = 1.0, log_prob_key: str = "action_log_prob") -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if rho_bar <= 0 or c_bar <= 0:
            raise ValueError(f"rho_bar and c_bar must be > 0, got {rho_bar}, {c_bar}")
        self.actor, self.critic, self.gamma = actor, critic, float(gamma)
        self.rho_bar, self.c_bar, self.log_prob_key = float(rho_bar), float(c_bar), log_prob_key

    @torch.no_grad()
    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        value, next_value = _state_values(self.critic, batch, "VTrace")
        log_mu = batch.get(self.log_prob_key, None)
        if log_mu is None:
            raise KeyError(f"V-trace needs the behaviour policy's log-probabilities {self.log_prob_key!r} in the "
                           f"batch (the collector stores what the policy writes); it has {sorted(batch.keys())}")
        log_pi = self.actor.get_dist(batch.select(*self.actor.in_keys, strict=False)).log_prob(batch.get("action"))
        log_pi, log_mu = log_pi.reshape(value.shape), log_mu.reshape(value.shape)
        nxt = batch.get("next")
        advantage, target = vtrace_advantage_estimate(
            self.gamma, log_pi, log_mu, value, next_value, nxt.get("reward"), nxt.get("done"), nxt.get("terminated"),
            rho_thresh=self.rho_bar, c_thresh=self.c_bar, time_dim=-2)
        batch.set("state_value", value)
        batch.set("advantage", advantage)
        batch.set("value_target", target)
        batch.set("rho", (log_pi - log_mu).exp().clamp_max(self.rho_bar))
        return batch
