"""TD3's loss with stacked critics: TorchRL's ``TD3Loss`` terms (tested equal), cheaper.

As in :mod:`tdrl.objectives.sac`, TorchRL's vmap over critic parameter sets and its parameter swaps cost more than
the networks on CPU; here the critics are one :class:`~tdrl.models.q.TwinQ`, and the target actor and critics are
the copies ``target_actor_net`` and ``target_qvalue_network`` (polyak-updated by ``TargetUpdate``). Terms, as
``TD3Loss`` (same random draws: the target-policy noise is drawn first), PER-weighted:

* ``loss_qvalue = sum_k (Q_k(s, a) - y)^2``,
  ``y = r + gamma^steps (1 - terminated) min_k Qtarget_k(s', clip(mu_target(s') + clip(sigma N, -c, c)))``;
* ``loss_actor = -Q_1(s, mu(s))`` through detached critics (the first critic only, as the paper).
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.objectives import LossModule

from tdrl.models.q import TwinQ, stacked_mlp
from tdrl.objectives.terms import check_gamma, td0_target, weighted_mean

__all__ = ["TwinQTD3Loss"]


class TwinQTD3Loss(LossModule):
    """TD3 (Fujimoto et al. 2018) with stacked critics; see the module docstring.

    Args:
        actor: deterministic ``TensorDictModule`` ``observation`` -> ``action`` (``make_deterministic_actor``).
        critic: :class:`~tdrl.models.q.TwinQ` (``make_twin_q``).
        action_low, action_high: the box target actions are clipped to.
        gamma: discount per env step.
        policy_noise: std of the target-policy smoothing noise, in action units (0: none).
        noise_clip: clip of that noise, in action units.
    """

    out_keys = ["loss_actor", "loss_qvalue"]

    def __init__(self, actor: TensorDictModule, critic: TwinQ, *, action_low: torch.Tensor,
            action_high: torch.Tensor, gamma: float = 0.99, policy_noise: float = 0.2, noise_clip: float = 0.5) -> None:
        super().__init__()
        if not isinstance(actor, TensorDictModule) or list(actor.in_keys) != ["observation"]:
            raise ValueError("TwinQTD3Loss needs a TensorDictModule actor reading 'observation' "
                             "(make_deterministic_actor)")
        if not isinstance(critic, TwinQ):
            raise ValueError(f"TwinQTD3Loss needs a TwinQ critic (make_twin_q), got {type(critic).__name__}")
        self.register_buffer("gamma", check_gamma(gamma))
        self.actor_network = actor
        self.actor_net = actor.module
        self.target_actor_net = copy.deepcopy(actor.module).requires_grad_(False)
        self.qvalue_network = critic
        self.target_qvalue_network = copy.deepcopy(critic).requires_grad_(False)
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32).clone())
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32).clone())
        self.policy_noise, self.noise_clip = float(policy_noise), float(noise_clip)

    def value_loss(self, sample: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss_qvalue`` and ``{"td_error": [n_critics, B] squared errors}``; gradients reach the critics only."""
        action = sample.get("action")
        next_obs = sample.get(("next", "observation"))
        critic = self.qvalue_network
        if self.policy_noise > 0:  # drawn before the target actor runs, as TorchRL does (same random stream)
            noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
        with torch.no_grad():
            next_action = self.target_actor_net(next_obs)
            if self.policy_noise > 0:
                next_action = next_action + noise
            next_action = next_action.clamp(self.action_low, self.action_high)
            next_q = self.target_qvalue_network(next_obs, next_action).min(0).values
            target = td0_target(sample, sample.get(("next", "reward")), next_q, self.gamma)
        error = critic(sample.get("observation"), action) - target  # [n, B, 1]
        loss = weighted_mean(error.pow(2).sum(0).squeeze(-1), sample)
        return loss, {"td_error": error.detach().pow(2).squeeze(-1)}

    def actor_loss(self, sample: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss_actor = -Q_1(s, mu(s))`` through detached critic parameters; gradients reach the actor only."""
        obs = sample.get("observation")
        first = [p.detach()[:1] for p in self.qvalue_network.flat_params()]
        q = stacked_mlp(first, self.qvalue_network.inputs(obs, self.actor_net(obs)))[0].squeeze(-1)
        return weighted_mean(-q, sample), {"state_action_value_actor": q.detach()}

    def forward(self, sample: TensorDictBase) -> TensorDict:
        """Both terms from the same parameters (``TD3Loss.forward``: actor loss first); writes the priority (max
        over critics of the squared TD error) into ``sample``."""
        loss_actor, _ = self.actor_loss(sample)
        loss_qvalue, meta = self.value_loss(sample)
        sample.set("td_error", meta["td_error"].max(0).values)
        return TensorDict(loss_actor=loss_actor, loss_qvalue=loss_qvalue)
