"""PPO's loss for feed-forward actor-critics on plain tensors (TorchRL's ``ClipPPOLoss`` terms), and A2C's, which is
TorchRL's ``A2CLoss``.

``ClipPPOLoss`` reaches the networks through TensorDict modules and functional parameter swaps, which on small MLPs
costs more than the networks, and PPO runs several minibatch updates per batch. :class:`PPOLoss` computes the same
terms (tested equal in values and gradients) with direct calls of :class:`tdrl.models.ActorCritic`'s
``distribution_and_value(obs)``; recurrent models (sequences through ``LSTMModule``) keep ``ClipPPOLoss``.

Terms (``A`` the advantage, ``R`` the value target, ``r = pi/pi_old``): ``loss_objective = -mean(min(r A, clip(r,
1-eps, 1+eps) A))``, ``loss_critic = critic_coeff * mean((V(s) - R)^2)``, ``loss_entropy = -entropy_coeff *
mean(H)`` (Monte-Carlo ``-log pi(a~)`` without a closed form, e.g. tanh-Gaussians); ``normalize_advantage``:
``(A - mean) / max(std, 1e-6)`` over the minibatch. Also written: ``entropy``, ``clip_fraction``, ``kl_approx``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import A2CLoss, ClipPPOLoss, LossModule

from tdrl.models.policies import ActorCritic

__all__ = ["PPOLoss", "make_a2c_loss", "make_ppo_loss"]


class PPOLoss(LossModule):
    """Clipped PPO loss for a feed-forward :class:`~tdrl.models.ActorCritic`; see the module docstring.
    ``clip_epsilon`` is a buffer (schedulable, like TorchRL's)."""

    def __init__(self, model: ActorCritic, *, clip_epsilon: float, critic_coeff: float, entropy_coeff: float,
            normalize_advantage: bool = False) -> None:
        super().__init__()
        if model.recurrent:
            raise ValueError("PPOLoss is for feed-forward models; use make_ppo_loss")
        self.model = model
        self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon)))
        self.critic_coeff, self.entropy_coeff = float(critic_coeff), float(entropy_coeff)
        self.normalize_advantage = normalize_advantage
        #: every key forward reads (select them before minibatch indexing: fewer tensors to gather)
        self.in_keys = ["observation", "action", "action_log_prob", "advantage", "value_target"]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs = td.get("observation")
        advantage = td.get("advantage").reshape(-1)
        if self.normalize_advantage and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
        dist, value = self.model.distribution_and_value(obs)  # a shared torso (images) runs once
        log_weight = dist.log_prob(td.get("action")).reshape(-1) - td.get("action_log_prob").reshape(-1)
        eps = self.clip_epsilon
        clipped = log_weight.clamp((-eps).log1p(), eps.log1p())
        gain = torch.minimum(log_weight.exp() * advantage, clipped.exp() * advantage)
        # entropy_coeff 0 (the CartPole default): the entropy is a metric only, so it stays out of the graph
        with torch.set_grad_enabled(self.entropy_coeff != 0 and torch.is_grad_enabled()):
            try:
                entropy = dist.entropy()
            except NotImplementedError:  # tanh-squashed Gaussian: one-sample Monte-Carlo estimate, as TorchRL
                entropy = -dist.log_prob(dist.rsample())
            entropy = entropy.mean()
        with torch.no_grad():
            clip_fraction = (clipped != log_weight).float().mean()
            kl_approx = (-log_weight).mean()
        return TensorDict(  # one construction: cheaper than a set per term
            loss_objective=-gain.mean(),
            loss_critic=self.critic_coeff * (value - td.get("value_target")).pow(2).mean(),
            loss_entropy=-self.entropy_coeff * entropy,
            entropy=entropy.detach(),
            clip_fraction=clip_fraction,
            kl_approx=kl_approx,
        )


def make_ppo_loss(model: ActorCritic, *, clip_epsilon: float, critic_coeff: float, entropy_coeff: float,
        normalize_advantage: bool) -> LossModule:
    """PPO loss: :class:`PPOLoss` for feed-forward models, TorchRL's ``ClipPPOLoss`` for recurrent ones."""
    if model.recurrent:
        return ClipPPOLoss(model.actor, model.critic, clip_epsilon=clip_epsilon, entropy_coeff=entropy_coeff,
                           critic_coeff=critic_coeff, loss_critic_type="l2", normalize_advantage=normalize_advantage)
    return PPOLoss(model, clip_epsilon=clip_epsilon, critic_coeff=critic_coeff, entropy_coeff=entropy_coeff,
                   normalize_advantage=normalize_advantage)


def make_a2c_loss(model: ActorCritic, *, critic_coeff: float, entropy_coeff: float) -> A2CLoss:
    """A2C loss: TorchRL's ``A2CLoss`` with a squared value error, for feed-forward and recurrent models."""
    return A2CLoss(model.actor, model.critic, entropy_coeff=entropy_coeff, critic_coeff=critic_coeff,
                   loss_critic_type="l2")
