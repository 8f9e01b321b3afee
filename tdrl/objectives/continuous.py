"""DDPG, TD3 and SAC on TorchRL's loss modules, wired for tdrl's replay samples.

TorchRL's ``DDPGLoss``, ``TD3Loss`` and ``SACLoss`` do the maths (squared-error critics, as the papers); tdrl wires
in what its replay samples carry: the n-step discount ``gamma ** steps_to_next_obs`` and PER weights
(:mod:`tdrl.objectives.terms`), and time-limit bootstrapping (``terminated`` stops the bootstrap, a time-limit
``truncated`` does not; :func:`timeouts_as_terminal` gives rlpyt's ``bootstrap_timelimit=False``). TD3's target
noise is relative to the half-width of the action box (the paper's 0.2/0.5 are for a [-1, 1] box).

Given a :class:`~tdrl.models.q.TwinQ` critic (``make_twin_q``), the DDPG and TD3 factories return
:class:`tdrl.objectives.td3.FusedTD3Loss`: the same terms (tested equal) on plain tensors. Target updates are the
caller's (``TargetUpdate`` with ``tau``).
"""

from __future__ import annotations

from typing import Literal

import torch
from tensordict import TensorDictBase
from torchrl.data import TensorSpec
from torchrl.objectives import DDPGLoss, LossModule, SACLoss, TD3Loss, ValueEstimators

from tdrl.models.q import TwinQ
from tdrl.objectives.td3 import FusedTD3Loss
from tdrl.objectives.terms import check_gamma
from tdrl.utils.keys import WEIGHT_KEY

__all__ = ["make_ddpg_loss", "make_sac_loss", "make_td3_loss", "timeouts_as_terminal"]


def _wire(loss: LossModule, gamma: float) -> LossModule:
    check_gamma(gamma)
    loss.set_keys(priority_weight=WEIGHT_KEY)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=gamma)  # reads steps_to_next_obs by default
    return loss


def _half_range(action_spec: TensorSpec) -> float:
    half = ((action_spec.space.high - action_spec.space.low) / 2).flatten()
    if not torch.allclose(half, half[0].expand_as(half)):
        raise ValueError(
            f"relative target noise needs one action scale, but the action box half-widths differ: {half.tolist()}"
        )
    return float(half[0])


def make_ddpg_loss(actor: torch.nn.Module, critic: torch.nn.Module, *, gamma: float = 0.99) -> DDPGLoss | FusedTD3Loss:
    """DDPG loss (Lillicrap et al. 2016) with target actor and critic.

    The actor loss is ``-Q(s, mu(s))`` through detached critic parameters, so ``loss_actor`` plus the critic's loss
    can be minimised in one backward pass by one optimizer (with separate learning rates as parameter groups).

    Args:
        actor: deterministic actor (``observation`` -> ``action``), e.g. ``make_deterministic_actor``.
        critic: ``Q(s, a)`` (``make_q_critic``: TorchRL's ``DDPGLoss``, loss key ``loss_value``), or a one-critic
            ``TwinQ`` (``FusedTD3Loss``, loss key ``loss_qvalue``).
    """
    if isinstance(critic, TwinQ):
        if critic.n_critics != 1:
            raise ValueError(f"DDPG has one critic; got a TwinQ with {critic.n_critics} (make_twin_q(n_critics=1))")
        return FusedTD3Loss(actor, critic, gamma=gamma, policy_noise=0.0, noise_clip=0.0)
    return _wire(DDPGLoss(actor, critic, loss_function="l2", delay_actor=True, delay_value=True), gamma)


def make_td3_loss(actor: torch.nn.Module, critic: torch.nn.Module, action_spec: TensorSpec, *, gamma: float = 0.99,
        target_noise: float = 0.2, target_noise_clip: float = 0.5) -> TD3Loss | FusedTD3Loss:
    """TD3 loss (Fujimoto et al. 2018): twin critics, clipped double-Q target, target policy smoothing.

    The delayed policy update is the caller's: ``loss.value_loss(sample)`` every update and
    ``loss.actor_loss(sample)`` every ``policy_update_interval`` updates (see ``recipes/td3.py``).

    Args:
        actor: deterministic actor.
        critic: one ``Q(s, a)`` critic (TorchRL's ``TD3Loss`` stacks two parameter sets), or a two-critic ``TwinQ``
            (``FusedTD3Loss``).
        action_spec: bounded action spec (target actions are clipped to it).
        target_noise: std of the target-action noise, relative to the half-width of the action box.
        target_noise_clip: clip of that noise, same units.
    """
    scale = _half_range(action_spec)
    noise, noise_clip = target_noise * scale, target_noise_clip * scale
    if isinstance(critic, TwinQ):
        return FusedTD3Loss(actor, critic, action_low=action_spec.space.low, action_high=action_spec.space.high,
                            gamma=gamma, policy_noise=noise, noise_clip=noise_clip)
    loss = TD3Loss(actor, critic, action_spec=action_spec, num_qvalue_nets=2, policy_noise=noise,
                   noise_clip=noise_clip, loss_function="l2")
    return _wire(loss, gamma)


def make_sac_loss(actor: torch.nn.Module, critic: torch.nn.Module, action_spec: TensorSpec, *, gamma: float = 0.99,
        alpha_init: float = 1.0, fixed_alpha: bool = False,
        target_entropy: float | Literal["auto"] = "auto") -> SACLoss:
    """TorchRL's SAC loss (the version without a state-value network) with twin critics, the reference of
    :class:`tdrl.objectives.sac.FusedSACLoss` (same arguments).

    Args:
        actor: tanh-Gaussian ``ProbabilisticActor`` (``make_tanh_gaussian_actor``).
        critic: one ``Q(s, a)`` critic; TorchRL stacks two parameter sets evaluated with one vmap.
        action_spec: bounded action spec (``target_entropy="auto"`` is ``-action_dim``).
    """
    loss = SACLoss(actor, critic, num_qvalue_nets=2, loss_function="l2", alpha_init=alpha_init,
                   fixed_alpha=fixed_alpha, target_entropy=target_entropy, action_spec=action_spec, delay_qvalue=True)
    return _wire(loss, gamma)


def timeouts_as_terminal(sample: TensorDictBase) -> TensorDictBase:
    """rlpyt's ``bootstrap_timelimit=False``: every ``done`` (time limits included) stops the bootstrap.

    Writes ``("next", "terminated") = ("next", "done")`` in place and returns the sample.
    """
    sample.set(("next", "terminated"), sample.get(("next", "done")).clone())
    return sample
