"""DDPG, TD3 and SAC on TorchRL's loss modules, wired for tdrl's replay samples.

TorchRL's ``DDPGLoss``, ``TD3Loss`` (twin critics, target policy smoothing) and ``SACLoss`` (twin critics,
automatic entropy tuning, tanh-squashed Gaussian) do the maths; the twin critics are one parameter stack that
TorchRL evaluates in a single vmapped call. tdrl adds:

* **Time-limit bootstrapping** (rlpyt's ``bootstrap_timelimit``). TorchRL's TD(0) target stops bootstrapping on
  ``("next", "terminated")`` only, and tdrl's collectors keep a time-limit cut in ``truncated`` with the true
  final observation in ``("next", "observation")``, so bootstrapping through time limits is the default.
  :func:`timeouts_as_terminal` gives rlpyt's ``bootstrap_timelimit=False`` (treat a time limit as a terminal).
* **n-step discount and IS weights**: the losses read the per-sample step count from ``steps_key`` (bootstrap
  ``gamma ** steps``) and PER weights from ``weight_key``, as in :mod:`tdrl.objectives.dqn`.
* **Units**: TD3's target noise is given relative to the half-width of the action box (the paper's 0.2/0.5 are
  for a [-1, 1] box), and losses default to the papers' squared error rather than TorchRL's ``smooth_l1``.

Given a :class:`~tdrl.models.q.TwinQ` critic (``make_twin_q``), the DDPG and TD3 factories return
:class:`tdrl.objectives.td3.FusedTD3Loss`: the same terms (tested equal) on plain tensors. Target updates are the
caller's (``tdrl.objectives.update.TargetUpdate`` with ``tau``). Arguments every factory takes: ``gamma`` (discount
per env step), ``loss_function`` (the critic's regression loss), ``steps_key`` (per-sample steps to the bootstrap
observation) and ``weight_key`` (PER importance weights).
"""

from __future__ import annotations

from typing import Literal

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import TensorSpec
from torchrl.objectives import DDPGLoss, SACLoss, TD3Loss, ValueEstimators

from tdrl.models.q import TwinQ
from tdrl.objectives.td3 import FusedTD3Loss
from tdrl.objectives.terms import STEPS_KEY, WEIGHT_KEY

__all__ = ["make_ddpg_loss", "make_sac_loss", "make_td3_loss", "timeouts_as_terminal"]

_LOSS_FUNCTIONS = {"mse": "l2", "huber": "smooth_l1"}


def _loss_fn(name: str) -> str:
    if name not in _LOSS_FUNCTIONS:
        raise ValueError(f"loss_function must be one of {sorted(_LOSS_FUNCTIONS)}, got {name!r}")
    return _LOSS_FUNCTIONS[name]


def _wire(loss, gamma: float, steps_key: NestedKey, weight_key: NestedKey):
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    loss.set_keys(priority_weight=weight_key)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
    loss.value_estimator.set_keys(steps_to_next_obs=steps_key)
    return loss


def _half_range(action_spec: TensorSpec) -> float:
    half = ((action_spec.space.high - action_spec.space.low) / 2).flatten()
    if not torch.allclose(half, half[0].expand_as(half)):
        raise ValueError(
            f"relative target noise needs one action scale, but the action box half-widths differ: {half.tolist()}"
        )
    return float(half[0])


def make_ddpg_loss(
    actor: torch.nn.Module,
    critic: torch.nn.Module,
    *,
    gamma: float = 0.99,
    loss_function: Literal["mse", "huber"] = "mse",
    steps_key: NestedKey = STEPS_KEY,
    weight_key: NestedKey = WEIGHT_KEY,
) -> DDPGLoss | FusedTD3Loss:
    """DDPG loss (Lillicrap et al. 2016) with target actor and critic.

    The actor loss is ``-Q(s, mu(s))`` through detached critic parameters, so ``loss_actor + loss_value`` can be
    minimised in one backward pass by one optimizer (with separate learning rates as parameter groups).

    Args:
        actor: deterministic actor (``observation`` -> ``action``), e.g. ``make_deterministic_actor``.
        critic: ``Q(s, a)`` (``observation``, ``action`` -> ``state_action_value``), e.g. ``make_q_critic``
            (TorchRL's ``DDPGLoss``, loss key ``loss_value``), or a one-critic ``TwinQ`` (``FusedTD3Loss``, loss key
            ``loss_qvalue``).
    """
    if isinstance(critic, TwinQ):
        if critic.n_critics != 1:
            raise ValueError(f"DDPG has one critic; got a TwinQ with {critic.n_critics} (make_twin_q(n_critics=1))")
        return FusedTD3Loss(actor, critic, gamma=gamma, policy_noise=0.0, noise_clip=0.0,
                            loss_function=_loss_fn(loss_function), steps_key=steps_key, weight_key=weight_key)
    loss = DDPGLoss(actor, critic, loss_function=_loss_fn(loss_function), delay_actor=True, delay_value=True)
    return _wire(loss, gamma, steps_key, weight_key)


def make_td3_loss(
    actor: torch.nn.Module,
    critic: torch.nn.Module,
    action_spec: TensorSpec,
    *,
    gamma: float = 0.99,
    target_noise: float = 0.2,
    target_noise_clip: float = 0.5,
    loss_function: Literal["mse", "huber"] = "mse",
    steps_key: NestedKey = STEPS_KEY,
    weight_key: NestedKey = WEIGHT_KEY,
) -> TD3Loss | FusedTD3Loss:
    """TD3 loss (Fujimoto et al. 2018): twin critics, clipped double-Q target, target policy smoothing.

    The delayed policy update is the caller's: compute ``loss.value_loss(sample)`` every update and
    ``loss.actor_loss(sample)`` every ``policy_update_interval`` updates (see ``recipes/td3.py``).

    Args:
        actor: deterministic actor.
        critic: one ``Q(s, a)`` critic (TorchRL's ``TD3Loss`` stacks two parameter sets, ``num_qvalue_nets=2``), or
            a two-critic ``TwinQ`` (``FusedTD3Loss``).
        action_spec: bounded action spec (target actions are clipped to it).
        target_noise: std of the target-action noise, relative to the half-width of the action box.
        target_noise_clip: clip of that noise, same units.
    """
    scale = _half_range(action_spec)
    if isinstance(critic, TwinQ):
        return FusedTD3Loss(actor, critic, action_low=action_spec.space.low, action_high=action_spec.space.high,
                            gamma=gamma, policy_noise=target_noise * scale, noise_clip=target_noise_clip * scale,
                            loss_function=_loss_fn(loss_function), steps_key=steps_key, weight_key=weight_key)
    loss = TD3Loss(actor, critic, action_spec=action_spec, num_qvalue_nets=2, policy_noise=target_noise * scale,
                   noise_clip=target_noise_clip * scale, loss_function=_loss_fn(loss_function))
    return _wire(loss, gamma, steps_key, weight_key)


def make_sac_loss(
    actor: torch.nn.Module,
    critic: torch.nn.Module,
    action_spec: TensorSpec,
    *,
    gamma: float = 0.99,
    alpha_init: float = 1.0,
    fixed_alpha: bool = False,
    target_entropy: float | Literal["auto"] = "auto",
    loss_function: Literal["mse", "huber"] = "mse",
    steps_key: NestedKey = STEPS_KEY,
    weight_key: NestedKey = WEIGHT_KEY,
) -> SACLoss:
    """SAC loss (Haarnoja et al. 2018, the version without a state-value network) with twin critics.

    ``loss_actor`` uses detached critic parameters and ``loss_alpha`` a detached log-probability, so the sum of
    the three losses can be minimised in one backward pass by one optimizer (parameter groups for the rates).

    Args:
        actor: tanh-Gaussian ``ProbabilisticActor`` (``make_tanh_gaussian_actor``).
        critic: one ``Q(s, a)`` critic; TorchRL stacks two parameter sets evaluated with one vmap.
        action_spec: bounded action spec (``target_entropy="auto"`` is ``-action_dim``).
        alpha_init: initial entropy temperature.
        fixed_alpha: keep alpha at ``alpha_init`` (rlpyt ``fixed_alpha``).
        target_entropy: entropy target of the automatic tuning, or ``"auto"``.
    """
    loss = SACLoss(actor, critic, num_qvalue_nets=2, loss_function=_loss_fn(loss_function), alpha_init=alpha_init,
                   fixed_alpha=fixed_alpha, target_entropy=target_entropy, action_spec=action_spec, delay_qvalue=True)
    return _wire(loss, gamma, steps_key, weight_key)


def timeouts_as_terminal(sample: TensorDictBase) -> TensorDictBase:
    """rlpyt's ``bootstrap_timelimit=False``: make every ``done`` (time limits included) stop the bootstrap.

    Writes ``("next", "terminated") = ("next", "done")`` in place and returns the sample.
    """
    sample.set(("next", "terminated"), sample.get(("next", "done")).clone())
    return sample
