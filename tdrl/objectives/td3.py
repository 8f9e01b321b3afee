"""TD3 loss with fused twin critics: TorchRL's ``TD3Loss`` terms at a lower cost per update.

TorchRL's ``TD3Loss`` spends ~4 ms per update on this CPU around ~1 ms of network work: a ``vmap`` over the
critic parameter sets, a TensorDict parameter swap (``to_module``) for every actor and critic evaluation with
online, target or detached parameters, and ``step_mdp``/``select``/``expand`` TensorDict copies. SB3's TD3 is
~1.3x faster per frame here (``benchmarks/learning.py --tasks td3-pendulum``). :class:`FusedTD3Loss` computes the
same two terms on plain tensors, as :class:`tdrl.objectives.sac.FusedSACLoss` does for SAC:

* the critics are one :class:`~tdrl.models.q.TwinQ` (stacked weights, one ``baddbmm`` per layer for all of them);
  online, target and detached evaluations pass parameter lists;
* the target actor is a copy of the actor's network whose parameters *are* ``target_actor_network_params`` (no
  gradient), so it is called directly; TorchRL's ``SoftUpdate`` pairs them with the online actor's parameters
  (``tdrl.objectives.update.TargetUpdate``).

Terms, as TorchRL's ``TD3Loss`` (same random draws: the target-policy noise is drawn first, as there), per sample
``i`` with PER weights ``w`` (sum-normalised):

* ``loss_qvalue = sum_k d(Q_k(s, a), y)``, ``d`` squared error (``"l2"``) or Huber (``"smooth_l1"``), with
  ``y = r + gamma^steps * (1 - terminated) * min_k Qtarget_k(s', clip(mu_target(s') + clip(sigma * N, -c, c)))``;
* ``loss_actor = -Q_1(s, mu(s))`` through detached critic parameters (the first critic only, as the paper).

With one critic, ``policy_noise=0`` and no action box this is DDPG's loss (TorchRL's ``DDPGLoss``).

in_keys: ``observation``, ``action``, ``("next", "observation")``, ``("next", "reward")``,
``("next", "terminated")``, optional ``steps_to_next_obs`` and ``priority_weight``.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.nn import TensorDictModule
from tensordict.utils import NestedKey
from torch.nn import functional as F

from tdrl.collect.tracing import HeadedMLP
from tdrl.models.q import ScaledTanh, TwinQ, stacked_mlp
from tdrl.objectives.fused import STEPS_KEY, WEIGHT_KEY, TwinCriticLoss

__all__ = ["FusedTD3Loss"]


class FusedTD3Loss(TwinCriticLoss):
    """TD3 (Fujimoto et al. 2018) / DDPG with fused critics; see the module docstring.

    Args:
        actor: deterministic ``TensorDictModule`` ``observation`` -> ``action`` (``make_deterministic_actor``).
        critic: :class:`~tdrl.models.q.TwinQ` (``make_twin_q``; ``n_critics=1`` for DDPG).
        action_low, action_high: the action box target actions are clipped to (TD3); ``None``: no clipping
            (TorchRL's DDPG).
        gamma: discount per env step (n-step samples bootstrap with ``gamma ** steps_to_next_obs``).
        policy_noise: std of the target-policy smoothing noise, in action units (0: none, DDPG).
        noise_clip: clip of that noise, in action units.
        loss_function: ``"l2"`` or ``"smooth_l1"`` (TorchRL's names).
        steps_key: key of the per-sample steps to the bootstrap observation.
        weight_key: key of the PER importance weights.

    Raises:
        ValueError: an actor that is not a plain ``TensorDictModule`` over ``observation``, a non-``TwinQ``
            critic, or bad ``gamma``/``loss_function``.
    """

    out_keys = ["loss_actor", "loss_qvalue"]

    def __init__(
        self,
        actor: TensorDictModule,
        critic: TwinQ,
        *,
        action_low: torch.Tensor | None = None,
        action_high: torch.Tensor | None = None,
        gamma: float = 0.99,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        loss_function: Literal["l2", "smooth_l1"] = "l2",
        steps_key: NestedKey = STEPS_KEY,
        weight_key: NestedKey = WEIGHT_KEY,
    ) -> None:
        if type(actor) is not TensorDictModule or list(actor.in_keys) != ["observation"]:
            raise ValueError("FusedTD3Loss needs a TensorDictModule actor reading 'observation' "
                             "(make_deterministic_actor)")
        if loss_function not in ("l2", "smooth_l1"):
            raise ValueError(f"loss_function must be 'l2' or 'smooth_l1', got {loss_function!r}")
        super().__init__(critic, gamma=gamma, steps_key=steps_key, weight_key=weight_key)
        self.actor_network = actor
        self.actor_net = actor.module
        target_net = copy.deepcopy(actor.module).requires_grad_(False)
        self.target_actor_net = target_net
        # make_deterministic_actor's MLP runs as layer functions (the target net once per update, the actor per policy
        # update); any other network is called as usual
        self._actor, self._target_actor = HeadedMLP(actor.module, ScaledTanh), HeadedMLP(target_net, ScaledTanh)
        self.actor_network_params = TensorDictParams(TensorDict.from_module(actor.module), no_convert=True)
        self.target_actor_network_params = TensorDictParams(TensorDict.from_module(target_net), no_convert=True)
        self._has_update_associated["actor_network"] = False
        self.clip_action = action_low is not None and action_high is not None
        if self.clip_action:
            self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32).clone())
            self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32).clone())
        self.policy_noise, self.noise_clip = float(policy_noise), float(noise_clip)
        self.loss_function = loss_function

    def value_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss_qvalue`` and ``{"td_error": [n_critics, B] squared errors}``; gradients reach the critics only."""
        keys = self.tensor_keys
        action = tensordict.get(keys.action)
        next_obs = tensordict.get(("next", keys.observation))
        reward = tensordict.get(("next", keys.reward))
        critic = self.qvalue_network
        if self.policy_noise > 0:  # drawn before the target actor runs, as TorchRL does (same random stream)
            noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
        with torch.no_grad():
            next_action = self._target_actor(next_obs)
            if self.policy_noise > 0:
                next_action = next_action + noise
            if self.clip_action:
                next_action = next_action.clamp(self.action_low, self.action_high)
            next_q = stacked_mlp(self.critic_params(target=True), critic.inputs(next_obs, next_action)).min(0).values
            target = self.td0_target(tensordict, reward, next_q)  # [B, 1]
        q = stacked_mlp(self.critic_params(),
                        critic.inputs(tensordict.get(keys.observation), action))  # [n, B, 1]
        error = q - target
        if self.loss_function == "l2":
            per_critic = error.pow(2)
        else:
            per_critic = F.smooth_l1_loss(q, target.expand_as(q), reduction="none")
        loss = self.weighted_mean(per_critic.sum(0).squeeze(-1), tensordict)
        return loss, {"td_error": error.detach().pow(2).squeeze(-1)}

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss_actor = -Q_1(s, mu(s))`` through detached critic parameters; gradients reach the actor only."""
        keys = self.tensor_keys
        obs = tensordict.get(keys.observation)
        first = [p.detach()[:1] for p in self.critic_params()]
        q = stacked_mlp(first, self.qvalue_network.inputs(obs, self._actor(obs)))[0].squeeze(-1)
        loss = self.weighted_mean(-q, tensordict)
        return loss, {"state_action_value_actor": q.detach()}

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Both terms from the same parameters (TorchRL's ``TD3Loss.forward``: actor loss first); writes the
        priority (max over critics of the squared TD error) into ``tensordict``."""
        loss_actor, _ = self.actor_loss(tensordict)
        loss_qvalue, meta = self.value_loss(tensordict)
        tensordict.set(self.tensor_keys.priority, meta["td_error"].max(0).values)
        return TensorDict(loss_actor=loss_actor, loss_qvalue=loss_qvalue)
