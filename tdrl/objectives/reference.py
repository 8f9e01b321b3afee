"""TorchRL's losses wired as tdrl wires its own: the oracles tdrl's losses are tested and timed against.

No recipe runs these. tdrl keeps its own loss for DQN, TD3, SAC and feed-forward PPO because each makes the whole
recipe iteration at least 1.2x faster (``benchmarks/learning.py --iteration all``, docs/learning.md#losses; DDPG
did not, so it runs TorchRL's ``DDPGLoss``); the tests check that tdrl's values and gradients equal these. The
wiring is what tdrl's replay samples carry (:func:`tdrl.objectives.continuous.wire_torchrl_loss`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torchrl.data import TensorSpec
from torchrl.objectives import ClipPPOLoss, DQNLoss, SACLoss, TD3Loss

from tdrl.objectives.continuous import action_half_range, wire_torchrl_loss

__all__ = ["torchrl_dqn_loss", "torchrl_ppo_loss", "torchrl_sac_loss", "torchrl_td3_loss"]

_LOSS_FUNCTIONS = {"huber": "smooth_l1", "mse": "l2"}


def torchrl_dqn_loss(q_actor: torch.nn.Module, *, gamma: float = 0.99, double_dqn: bool = False,
        loss_function: Literal["huber", "mse"] = "huber") -> DQNLoss:
    """TorchRL's ``DQNLoss`` with a delayed target network; arguments as :func:`tdrl.objectives.dqn.make_dqn_loss`."""
    spec: Any = q_actor.spec
    loss = DQNLoss(q_actor, loss_function=_LOSS_FUNCTIONS[loss_function], delay_value=True, double_dqn=double_dqn,
                   action_space=spec["action"] if hasattr(spec, "keys") else spec)
    return wire_torchrl_loss(loss, gamma)


def torchrl_td3_loss(actor: torch.nn.Module, critic: torch.nn.Module, action_spec: TensorSpec, *,
        gamma: float = 0.99, target_noise: float = 0.2, target_noise_clip: float = 0.5) -> TD3Loss:
    """TorchRL's ``TD3Loss`` (two stacked parameter sets of one ``make_q_critic`` critic); target noise relative to
    the action box's half-width, as :func:`tdrl.objectives.continuous.make_td3_loss`."""
    scale = action_half_range(action_spec)
    loss = TD3Loss(actor, critic, action_spec=action_spec, num_qvalue_nets=2, policy_noise=target_noise * scale,
                   noise_clip=target_noise_clip * scale, loss_function="l2")
    return wire_torchrl_loss(loss, gamma)


def torchrl_sac_loss(actor: torch.nn.Module, critic: torch.nn.Module, action_spec: TensorSpec, *,
        gamma: float = 0.99, alpha_init: float = 1.0, fixed_alpha: bool = False,
        target_entropy: float | Literal["auto"] = "auto") -> SACLoss:
    """TorchRL's ``SACLoss`` (no state-value network, two stacked critics), arguments as
    :class:`tdrl.objectives.sac.TwinQSACLoss`."""
    loss = SACLoss(actor, critic, num_qvalue_nets=2, loss_function="l2", alpha_init=alpha_init,
                   fixed_alpha=fixed_alpha, target_entropy=target_entropy, action_spec=action_spec, delay_qvalue=True)
    return wire_torchrl_loss(loss, gamma)


def torchrl_ppo_loss(model: Any, **kwargs: Any) -> ClipPPOLoss:
    """TorchRL's ``ClipPPOLoss`` on an ``ActorCritic``'s actor and critic, squared value error; ``kwargs`` as
    :func:`tdrl.objectives.policy_gradient.make_ppo_loss`."""
    return ClipPPOLoss(model.actor, model.critic, loss_critic_type="l2", **kwargs)
