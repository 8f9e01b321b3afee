"""SAC's loss with stacked twin critics: TorchRL's ``SACLoss`` terms (tested equal) at a lower cost per update.

TorchRL's ``SACLoss`` evaluates its critics through TensorDict parameter swaps and vmap, which on CPU costs more than
the 256-wide networks, and the recipe's iteration is dominated by the update (one per env step). Here the critics
are one :class:`~tdrl.models.q.TwinQ` (one ``baddbmm`` per layer for both) and the policy is sampled as TorchRL's
``TanhNormal`` (same random draws). Terms, as ``SACLoss`` (v2, no value net), PER-weighted:

* ``loss_qvalue = sum_k (Q_k(s, a) - y)^2``, ``y = r + gamma^steps (1 - terminated)
  (min_k Qtarget_k(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi(s')``;
* ``loss_actor = alpha log pi(a~|s) - min_k Q_k(s, a~)`` through detached critics;
* ``loss_alpha = -log_alpha (log pi(a~|s) + target_entropy)`` with a detached log-probability.

:meth:`TwinQSACLoss.critic_loss` and :meth:`TwinQSACLoss.actor_loss` split them for SB3's order (step the critics,
then the policy against the updated critics).
"""

from __future__ import annotations

import copy
import math
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential
from torch import nn
from torch.nn import functional as F
from torchrl.modules import TanhNormal
from torchrl.objectives import LossModule

from tdrl.models.q import LogStdGaussianParams, TwinQ, stacked_mlp
from tdrl.objectives.terms import check_gamma, td0_target, weighted_mean

__all__ = ["TwinQSACLoss"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class TwinQSACLoss(LossModule):
    """SAC (Haarnoja et al. 2018, no value network) with stacked twin critics; see the module docstring.

    Args:
        actor: tanh-Gaussian ``ProbabilisticActor`` (``make_tanh_gaussian_actor``): its first module maps
            ``observation`` to ``loc``, ``scale``; its distribution is ``TanhNormal`` with ``low``/``high``.
        critic: :class:`~tdrl.models.q.TwinQ` (``make_twin_q``); its target copy is ``target_qvalue_network``.
        gamma: discount per env step.
        alpha_init: initial entropy temperature.
        fixed_alpha: keep alpha at ``alpha_init``.
        target_entropy: entropy target, or ``"auto"`` (``-action_dim``).
    """

    out_keys = ["loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"]

    def __init__(self, actor: ProbabilisticTensorDictSequential, critic: TwinQ, *, gamma: float = 0.99,
            alpha_init: float = 1.0, fixed_alpha: bool = False,
            target_entropy: float | Literal["auto"] = "auto") -> None:
        super().__init__()
        head = actor[-1] if isinstance(actor, ProbabilisticTensorDictSequential) else None
        if head is None or getattr(head, "distribution_class", None) is not TanhNormal:
            raise ValueError("TwinQSACLoss needs a TanhNormal ProbabilisticActor (make_tanh_gaussian_actor)")
        if not isinstance(critic, TwinQ):
            raise ValueError(f"TwinQSACLoss needs a TwinQ critic (make_twin_q), got {type(critic).__name__}")
        self.register_buffer("gamma", check_gamma(gamma))
        self.actor_network = actor
        self.policy_net = actor[0].module  # observation -> (loc, scale)
        self.qvalue_network = critic
        self.target_qvalue_network = copy.deepcopy(critic).requires_grad_(False)
        low = torch.as_tensor(head.distribution_kwargs["low"], dtype=torch.float32)
        high = torch.as_tensor(head.distribution_kwargs["high"], dtype=torch.float32)
        self.register_buffer("action_loc", (high + low) / 2)
        self.register_buffer("action_scale", (high - low) / 2)
        action_dim = int(low.numel())
        entropy = -float(action_dim) if target_entropy == "auto" else float(target_entropy)
        self.register_buffer("target_entropy", torch.tensor(entropy))
        # the log-probability's constant: -d log sqrt(2 pi) - 2 d log 2 - sum log((high - low) / 2)
        self.register_buffer("log_prob_offset",
                             -action_dim * (_LOG_SQRT_2PI + 2 * math.log(2.0)) - self.action_scale.log().sum())
        log_alpha = torch.tensor(math.log(alpha_init))
        if fixed_alpha:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)

    def policy_loc_log_std(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's Gaussian ``loc`` and ``log(scale)`` (read before the ``exp`` when the network ends with a
        :class:`~tdrl.models.q.LogStdGaussianParams`, as ``make_tanh_gaussian_actor``'s does)."""
        net = self.policy_net
        if isinstance(net, nn.Sequential) and isinstance(net[-1], LogStdGaussianParams):
            h = observation
            for i in range(len(net) - 1):
                h = net[i](h)
            return net[-1].loc_log_std(h)
        loc, scale = net(observation)
        return loc, scale.log()

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

    def critic_loss(self, sample: TensorDictBase) -> TensorDict:
        """``loss_qvalue``; writes ``td_error`` (max over critics of ``|Q - y|``) into ``sample``. Gradients reach the
        critics only."""
        obs, next_obs = sample.get("observation"), sample.get(("next", "observation"))
        reward = sample.get(("next", "reward"))
        alpha = self.log_alpha.detach().exp()
        critic = self.qvalue_network
        with torch.no_grad():  # clipped double-Q soft target
            next_action, next_log_prob = self.sample_and_log_prob(next_obs)
            next_q = stacked_mlp(self.target_qvalue_network.flat_params(),
                                 critic.inputs(next_obs, next_action)).min(0).values
            target = td0_target(sample, reward, next_q - alpha * next_log_prob[..., None], self.gamma)
        error = critic(obs, sample.get("action")) - target  # [n, B, 1]
        sample.set("td_error", error.detach().abs().max(0).values)
        return TensorDict(loss_qvalue=weighted_mean(error.pow(2).sum(0).squeeze(-1), sample))

    def actor_loss(self, sample: TensorDictBase) -> TensorDict:
        """``loss_actor`` (through detached critics), ``loss_alpha`` (through a detached log-probability), ``alpha``
        and ``entropy``; gradients reach the policy and ``log_alpha`` only."""
        obs = sample.get("observation")
        alpha = self.log_alpha.detach().exp()
        action, log_prob = self.sample_and_log_prob(obs)
        detached = [p.detach() for p in self.qvalue_network.flat_params()]
        q = stacked_mlp(detached, self.qvalue_network.inputs(obs, action)).min(0).values
        return TensorDict(
            loss_actor=weighted_mean(alpha * log_prob - q.squeeze(-1), sample),
            loss_alpha=weighted_mean(-self.log_alpha * (log_prob.detach() + self.target_entropy), sample),
            alpha=alpha,
            entropy=-log_prob.detach().mean(),
        )

    def forward(self, sample: TensorDictBase) -> TensorDict:
        """All terms from the same parameters (``SACLoss``'s semantics and random-draw order)."""
        out = self.critic_loss(sample)
        out.update(self.actor_loss(sample))
        return out
