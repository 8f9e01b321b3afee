"""DDPG and TD3 for tdrl's replay samples: DDPG is TorchRL's ``DDPGLoss``; TD3 is
:class:`tdrl.objectives.td3.TwinQTD3Loss` on a ``TwinQ`` critic, ``TD3Loss``'s terms (tested equal to
:mod:`tdrl.objectives.reference`) at ~1.5x less per whole iteration (docs/learning.md#losses: tdrl's own DDPG
gained only 12-23%, under the 1.2x that keeping a loss of our own needs). Squared-error critics, as the papers,
with what tdrl's replay samples carry: the n-step discount
``gamma ** steps_to_next_obs`` and PER weights (:mod:`tdrl.objectives.terms`), and time-limit bootstrapping
(``terminated`` stops the bootstrap, a time-limit ``truncated`` does not; :func:`timeouts_as_terminal` gives rlpyt's
``bootstrap_timelimit=False``). TD3's target noise is relative to the half-width of the action box (the paper's
0.2/0.5 are for a [-1, 1] box). Target updates are the caller's (``TargetUpdate`` with ``tau``).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data import TensorSpec
from torchrl.objectives import DDPGLoss, LossModule, ValueEstimators

from tdrl.models.q import TwinQ
from tdrl.objectives.td3 import TwinQTD3Loss
from tdrl.objectives.terms import check_gamma
from tdrl.utils.keys import WEIGHT_KEY

__all__ = ["action_half_range", "make_ddpg_loss", "make_td3_loss", "timeouts_as_terminal", "wire_torchrl_loss"]


def wire_torchrl_loss(loss: LossModule, gamma: float) -> LossModule:
    """Point a TorchRL loss at tdrl's replay samples: PER weights under ``priority_weight``, and a TD(0) estimator
    that bootstraps with ``gamma ** steps_to_next_obs`` (its default key), so n-step samples need nothing else."""
    check_gamma(gamma)
    loss.set_keys(priority_weight=WEIGHT_KEY)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
    return loss


def action_half_range(action_spec: TensorSpec) -> float:
    """The half-width of a bounded action box whose dimensions share one scale (target noise is relative to it)."""
    half = ((action_spec.space.high - action_spec.space.low) / 2).flatten()
    if not torch.allclose(half, half[0].expand_as(half)):
        raise ValueError(
            f"relative target noise needs one action scale, but the action box half-widths differ: {half.tolist()}"
        )
    return float(half[0])


def make_ddpg_loss(actor: torch.nn.Module, critic: torch.nn.Module, *, gamma: float = 0.99) -> DDPGLoss:
    """DDPG loss (Lillicrap et al. 2016): TorchRL's ``DDPGLoss`` (squared error) with target actor and critic.

    The actor loss is ``-Q(s, mu(s))`` through detached critic parameters, so ``loss_actor`` plus the critic's
    ``loss_value`` can be minimised in one backward pass by one optimizer (separate learning rates as groups).

    Args:
        actor: deterministic actor (``observation`` -> ``action``), e.g. ``make_deterministic_actor``.
        critic: ``Q(s, a)`` (``make_q_critic``: ``observation``, ``action`` -> ``state_action_value``).
    """
    return wire_torchrl_loss(DDPGLoss(actor, critic, loss_function="l2", delay_actor=True, delay_value=True), gamma)


def make_td3_loss(actor: torch.nn.Module, critic: TwinQ, action_spec: TensorSpec, *, gamma: float = 0.99,
        target_noise: float = 0.2, target_noise_clip: float = 0.5) -> TwinQTD3Loss:
    """TD3 loss (Fujimoto et al. 2018): twin critics, clipped double-Q target, target policy smoothing.

    The delayed policy update is the caller's: ``loss.value_loss(sample)`` every update and
    ``loss.actor_loss(sample)`` every ``policy_update_interval`` updates (see ``recipes/td3.py``).

    Args:
        actor: deterministic actor.
        critic: a two-critic ``TwinQ`` (``make_twin_q``).
        action_spec: bounded action spec (target actions are clipped to it).
        target_noise: std of the target-action noise, relative to the half-width of the action box.
        target_noise_clip: clip of that noise, same units.
    """
    scale = action_half_range(action_spec)
    return TwinQTD3Loss(actor, critic, action_low=action_spec.space.low, action_high=action_spec.space.high,
                        gamma=gamma, policy_noise=target_noise * scale, noise_clip=target_noise_clip * scale)


def timeouts_as_terminal(sample: TensorDictBase) -> TensorDictBase:
    """rlpyt's ``bootstrap_timelimit=False``: every ``done`` (time limits included) stops the bootstrap.

    Writes ``("next", "terminated") = ("next", "done")`` in place and returns the sample.
    """
    sample.set(("next", "terminated"), sample.get(("next", "done")).clone())
    return sample
