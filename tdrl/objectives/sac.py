"""SAC loss with fused twin critics: TorchRL's ``SACLoss`` terms at a lower cost per update.

TorchRL's ``SACLoss`` spends several milliseconds per update outside the networks on this CPU (TensorDict
parameter swaps for each critic and target evaluation, distribution objects, vmap bookkeeping, a ``find_spec``
per module output): with 256-wide MLPs its update is ~1.2x SB3's (``benchmarks/learning.py --losses``). The
objective itself is small, so :class:`FusedSACLoss` computes the same three terms on plain tensors:

* the twin critics are one :class:`~tdrl.models.q.TwinQ` (stacked weights, one ``baddbmm`` per layer for both;
  optionally reading actions rescaled to [-1, 1]); online, target and detached evaluations pass parameter lists
  instead of swapping module state;
* the tanh-Gaussian policy is the network inside the recipe's TorchRL ``ProbabilisticActor`` (the collector keeps
  acting with the TorchRL actor); samples and log-probabilities follow TorchRL's ``TanhNormal`` with
  ``low``/``high`` (Normal log-density, minus the tanh and affine log-Jacobians).

Terms, as TorchRL's ``SACLoss`` (v2, no state-value net), per sample ``i`` with PER weights ``w`` (sum-normalised):

* ``loss_qvalue = sum_k (Q_k(s, a) - y)^2`` with ``y = r + gamma^steps * (1 - terminated) *
  (min_k Qtarget_k(s', a') - alpha * log pi(a'|s'))``, ``a' ~ pi(s')``;
* ``loss_actor = alpha * log pi(a~|s) - min_k Q_k(s, a~)`` through detached critic parameters;
* ``loss_alpha = -log_alpha * (log pi(a~|s) + target_entropy)`` with a detached log-probability.

``forward`` returns the three terms from the same parameters (TorchRL's semantics; they reach disjoint parameters,
so one optimizer can minimise their sum). :meth:`FusedSACLoss.critic_loss` and :meth:`FusedSACLoss.actor_loss` give
the critic term and the policy/temperature terms separately, for SB3's order (step the critics, then compute the
policy loss against the updated critics; ``recipes/sac.py``). Target critics are ``target_qvalue_network_params``,
so TorchRL's ``SoftUpdate`` (``tdrl.objectives.update.TargetUpdate``) works unchanged. Equality with TorchRL's
``SACLoss`` (same parameters, same random draws; critics reading raw actions) is tested.

in_keys: ``observation``, ``action``, ``("next", "observation")``, ``("next", "reward")``,
``("next", "terminated")``, optional ``steps_to_next_obs`` and ``priority_weight``. out_keys: ``loss_actor``,
``loss_qvalue``, ``loss_alpha``, ``alpha``, ``entropy``; writes ``td_error`` (max over critics of ``|Q - y|``)
into the sample.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential
from tensordict.utils import NestedKey
from torch import nn
from torch.nn import functional as F
from torchrl.modules import TanhNormal

from tdrl.collect.tracing import HeadedMLP
from tdrl.models.q import LogStdGaussianParams, TwinQ, stacked_mlp
from tdrl.objectives.fused import STEPS_KEY, WEIGHT_KEY, TwinCriticLoss

__all__ = ["FusedSACLoss"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class FusedSACLoss(TwinCriticLoss):
    """SAC (Haarnoja et al. 2018, no value network) with fused twin critics; see the module docstring.

    Args:
        actor: tanh-Gaussian ``ProbabilisticActor`` (``make_tanh_gaussian_actor``): its first module maps
            ``observation`` to ``loc``, ``scale``; its distribution is ``TanhNormal`` with ``low``/``high``.
        critic: :class:`~tdrl.models.q.TwinQ` (``make_twin_q``).
        gamma: discount per env step (n-step samples bootstrap with ``gamma ** steps_to_next_obs``).
        alpha_init: initial entropy temperature.
        fixed_alpha: keep alpha at ``alpha_init``.
        target_entropy: entropy target, or ``"auto"`` (``-action_dim``).
        steps_key: key of the per-sample steps to the bootstrap observation.
        weight_key: key of the PER importance weights.

    Raises:
        ValueError: an actor that is not a TanhNormal ``ProbabilisticActor``, or a bad ``gamma``.
    """

    out_keys = ["loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"]

    def __init__(
        self,
        actor: ProbabilisticTensorDictSequential,
        critic: TwinQ,
        *,
        gamma: float = 0.99,
        alpha_init: float = 1.0,
        fixed_alpha: bool = False,
        target_entropy: float | Literal["auto"] = "auto",
        steps_key: NestedKey = STEPS_KEY,
        weight_key: NestedKey = WEIGHT_KEY,
    ) -> None:
        head = actor[-1] if isinstance(actor, ProbabilisticTensorDictSequential) else None
        if head is None or getattr(head, "distribution_class", None) is not TanhNormal:
            raise ValueError("FusedSACLoss needs a TanhNormal ProbabilisticActor (make_tanh_gaussian_actor)")
        super().__init__(critic, gamma=gamma, steps_key=steps_key, weight_key=weight_key)
        low = torch.as_tensor(head.distribution_kwargs["low"], dtype=torch.float32)
        high = torch.as_tensor(head.distribution_kwargs["high"], dtype=torch.float32)
        self.actor_network = actor
        self.policy_net = actor[0].module  # observation -> (loc, scale)
        self.register_buffer("action_loc", (high + low) / 2)
        self.register_buffer("action_scale", (high - low) / 2)
        action_dim = int(low.numel())
        entropy = -float(action_dim) if target_entropy == "auto" else float(target_entropy)
        self.register_buffer("target_entropy", torch.tensor(entropy))
        # the log-probability's constant: -d log sqrt(2 pi) - 2 d log 2 - sum log((high - low) / 2)
        self.register_buffer("log_prob_offset",
                             -action_dim * (_LOG_SQRT_2PI + 2 * math.log(2.0)) - self.action_scale.log().sum())
        self._policy = HeadedMLP(self.policy_net, LogStdGaussianParams)
        log_alpha = torch.tensor(math.log(alpha_init))
        if fixed_alpha:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)

    # --- pieces -----------------------------------------------------------------------------------------------

    def policy_loc_log_std(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's Gaussian ``loc`` and ``log(scale)``.

        For ``make_tanh_gaussian_actor``'s network (an MLP, then :class:`~tdrl.models.q.LogStdGaussianParams`) the
        layers run as functions (:class:`~tdrl.collect.tracing.HeadedMLP`: ``nn.Module.__call__`` costs ~10 us per
        layer here, two policy evaluations per update) and the log-std is read before its ``exp``; any other network
        is called as usual.
        """
        body = self._policy.body(observation)
        if body is None:
            loc, scale = self.policy_net(observation)
            return loc, scale.log()
        return self._policy.head.loc_log_std(body)

    def sample_and_log_prob(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised action in the box and its log-probability (TorchRL's ``TanhNormal``, same draws)."""
        loc, log_std = self.policy_loc_log_std(observation)
        noise = torch.empty_like(loc).normal_()
        pre_tanh = torch.addcmul(loc, log_std.exp(), noise)
        action = torch.addcmul(self.action_loc, self.action_scale, torch.tanh(pre_tanh))
        # log N(noise) - log|d action / d pre_tanh| per dimension, constants summed once (log_prob_offset):
        # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)) (numerically stable), plus the affine rescaling
        per_dim = 2.0 * (pre_tanh + F.softplus(-2.0 * pre_tanh)) - log_std
        return action, torch.addcmul(per_dim, noise, noise, value=-0.5).sum(-1) + self.log_prob_offset

    # --- loss -------------------------------------------------------------------------------------------------

    def critic_loss(self, tensordict: TensorDictBase) -> TensorDict:
        """``loss_qvalue`` (writes ``td_error`` into ``tensordict``); gradients reach the critics only."""
        keys = self.tensor_keys
        obs = tensordict.get(keys.observation)
        next_obs = tensordict.get(("next", keys.observation))
        reward = tensordict.get(("next", keys.reward))
        alpha = self.log_alpha.detach().exp()
        critic = self.qvalue_network
        with torch.no_grad():  # clipped double-Q soft target
            next_action, next_log_prob = self.sample_and_log_prob(next_obs)
            next_q = stacked_mlp(self.critic_params(target=True), critic.inputs(next_obs, next_action)).min(0).values
            target = self.td0_target(tensordict, reward, next_q - alpha * next_log_prob[..., None])
        q = stacked_mlp(self.critic_params(),
                        critic.inputs(obs, tensordict.get(keys.action)))  # [n, B, 1]
        error = q - target
        tensordict.set(keys.priority, error.detach().abs().max(0).values)
        return TensorDict(loss_qvalue=self.weighted_mean(error.pow(2).sum(0).squeeze(-1), tensordict))

    def actor_loss(self, tensordict: TensorDictBase) -> TensorDict:
        """``loss_actor`` (through detached critics) and ``loss_alpha`` (through a detached log-probability),
        with ``alpha`` and ``entropy``; gradients reach the policy and ``log_alpha`` only."""
        keys = self.tensor_keys
        obs = tensordict.get(keys.observation)
        alpha = self.log_alpha.detach().exp()
        action, log_prob = self.sample_and_log_prob(obs)
        detached = [p.detach() for p in self.critic_params()]
        q = stacked_mlp(detached, self.qvalue_network.inputs(obs, action)).min(0).values
        return TensorDict(
            loss_actor=self.weighted_mean(alpha * log_prob - q.squeeze(-1), tensordict),
            loss_alpha=self.weighted_mean(-self.log_alpha * (log_prob.detach() + self.target_entropy), tensordict),
            alpha=alpha,
            entropy=-log_prob.detach().mean(),
        )

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """All terms from the same parameters (TorchRL's ``SACLoss`` semantics and random-draw order)."""
        out = self.critic_loss(tensordict)
        out.update(self.actor_loss(tensordict))
        return out
