"""PPO and A2C objectives for feed-forward actor-critics on plain tensors: TorchRL's losses, less overhead.

TorchRL's ``ClipPPOLoss``/``A2CLoss`` reach the networks through TensorDict modules (distribution parameters written
to and read from TensorDicts, functional parameter swaps), which on CartPole-sized MLPs costs more than the networks.
:class:`ActorCriticLoss` computes the same terms (tested equal in values and gradients) with direct calls of
:class:`tdrl.models.ActorCritic`'s plain-tensor methods (``distribution(obs)``, ``value(obs)``).
:func:`make_ppo_loss`/:func:`make_a2c_loss` return it for feed-forward models and TorchRL's loss for recurrent
ones (which replay sequences through ``LSTMModule``), with the same output keys and schedulable ``clip_epsilon``.

Terms (rlpyt / TorchRL conventions; ``A`` is the advantage, ``R`` the value target, ``r = pi/pi_old``):

* PPO: ``loss_objective = -mean(min(r A, clip(r, 1-eps, 1+eps) A))``; A2C (``clip_epsilon=None``):
  ``loss_objective = -mean(log pi(a|s) A)``;
* ``loss_critic = critic_coeff * mean((V(s) - R)^2)`` (rlpyt's ``value_loss_coeff * 0.5`` is ``critic_coeff``);
* ``loss_entropy = -entropy_coeff * mean(H)`` (Monte-Carlo ``-log pi(a~)`` for distributions without a closed form,
  e.g. tanh-squashed Gaussians);
* ``normalize_advantage``: ``(A - mean) / max(std, 1e-6)`` over the minibatch (sample std, as TorchRL).

Keys read: ``observation``, ``action``, ``action_log_prob`` (PPO), ``advantage``, ``value_target``.
Keys written: ``loss_objective``, ``loss_critic``, ``loss_entropy``, ``entropy``, and for PPO ``clip_fraction``,
``kl_approx`` (mean of ``log pi_old - log pi``).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import A2CLoss, ClipPPOLoss, LossModule

from tdrl.models.policies import ActorCritic

__all__ = ["ActorCriticLoss", "make_a2c_loss", "make_ppo_loss"]


class ActorCriticLoss(LossModule):
    """Clipped PPO (``clip_epsilon`` set) or A2C (``clip_epsilon=None``) loss for a feed-forward ActorCritic.

    Args:
        model: a feed-forward :class:`~tdrl.models.ActorCritic`.
        clip_epsilon: PPO likelihood-ratio clip (a schedulable buffer, like TorchRL's), or ``None`` for A2C.
        critic_coeff: weight of the squared value error.
        entropy_coeff: weight of the entropy bonus.
        normalize_advantage: standardise advantages per call (minibatch).
    """

    def __init__(
        self,
        model: ActorCritic,
        *,
        clip_epsilon: float | None,
        critic_coeff: float,
        entropy_coeff: float,
        normalize_advantage: bool = False,
    ) -> None:
        super().__init__()
        if model.recurrent:
            raise ValueError("ActorCriticLoss is for feed-forward models; use make_ppo_loss/make_a2c_loss")
        self.model = model
        self.ppo = clip_epsilon is not None
        self.register_buffer("clip_epsilon", torch.tensor(float(clip_epsilon if self.ppo else math.nan)))
        self.critic_coeff, self.entropy_coeff = float(critic_coeff), float(entropy_coeff)
        self.normalize_advantage = normalize_advantage
        #: every key forward reads (select them before minibatch indexing: fewer tensors to gather)
        self.in_keys = ["observation", "action", *(["action_log_prob"] if self.ppo else []), "advantage",
                        "value_target"]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs, action = td.get("observation"), td.get("action")
        advantage = td.get("advantage").reshape(-1)
        if self.normalize_advantage and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
        dist = self.model.distribution(obs)
        log_prob = dist.log_prob(action).reshape(-1)
        out = TensorDict()
        if self.ppo:
            log_weight = log_prob - td.get("action_log_prob").reshape(-1)
            eps = self.clip_epsilon
            clipped = log_weight.clamp((-eps).log1p(), eps.log1p())
            gain = torch.minimum(log_weight.exp() * advantage, clipped.exp() * advantage)
            out.set("loss_objective", -gain.mean())
            with torch.no_grad():
                out.set("clip_fraction", (clipped != log_weight).float().mean())
                out.set("kl_approx", (-log_weight).mean())
        else:
            out.set("loss_objective", -(log_prob * advantage).mean())
        value = self.model.value(obs)
        out.set("loss_critic", self.critic_coeff * (value - td.get("value_target")).pow(2).mean())
        try:
            entropy = dist.entropy()
        except NotImplementedError:  # tanh-squashed Gaussian: one-sample Monte-Carlo estimate, as TorchRL
            entropy = -dist.log_prob(dist.rsample())
        entropy = entropy.mean()
        out.set("loss_entropy", -self.entropy_coeff * entropy)
        out.set("entropy", entropy.detach())
        return out


def make_ppo_loss(
    model: ActorCritic,
    *,
    clip_epsilon: float,
    critic_coeff: float,
    entropy_coeff: float,
    normalize_advantage: bool,
) -> LossModule:
    """PPO loss: :class:`ActorCriticLoss` for feed-forward models, TorchRL's ``ClipPPOLoss`` for recurrent ones."""
    if model.recurrent:
        return ClipPPOLoss(model.actor, model.critic, clip_epsilon=clip_epsilon, entropy_coeff=entropy_coeff,
                           critic_coeff=critic_coeff, loss_critic_type="l2", normalize_advantage=normalize_advantage)
    return ActorCriticLoss(model, clip_epsilon=clip_epsilon, critic_coeff=critic_coeff, entropy_coeff=entropy_coeff,
                           normalize_advantage=normalize_advantage)


def make_a2c_loss(model: ActorCritic, *, critic_coeff: float, entropy_coeff: float) -> LossModule:
    """A2C loss: :class:`ActorCriticLoss` for feed-forward models, TorchRL's ``A2CLoss`` for recurrent ones."""
    if model.recurrent:
        return A2CLoss(model.actor, model.critic, entropy_coeff=entropy_coeff, critic_coeff=critic_coeff,
                       loss_critic_type="l2")
    return ActorCriticLoss(model, clip_epsilon=None, critic_coeff=critic_coeff, entropy_coeff=entropy_coeff)
