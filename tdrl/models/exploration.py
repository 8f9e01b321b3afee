"""Exploration for the Q-learning families: epsilon-greedy and Gaussian action noise, both acting on tensors too.

Both follow TorchRL's convention: they explore under ``ExplorationType.RANDOM`` and step aside under any other
type (evaluation), so an evaluator needs no second policy. :class:`EpsilonGreedy` is tdrl's own because TorchRL's
``EGreedyModule`` has a scalar epsilon only and anneals from frame 0; rlpyt's semantics are kept: ``eps_init`` until
``start_frames``, then linear to ``eps_final`` at ``end_frames``; vector epsilon (Ape-X, ``eps_final_min``:
per-env final values log-spaced up to ``eps_final``); evaluation with ``eps_eval`` (0.001, so a deterministic policy
cannot loop forever).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.envs.utils import ExplorationType, exploration_type

from tdrl.models.acting import Inputs, Outputs

__all__ = ["EpsilonGreedy", "GaussianNoise", "linear_epsilon", "make_gaussian_noise", "vector_epsilon"]

ENV_INDEX_KEY = ("collector", "env_index")


def vector_epsilon(n_envs: int, eps_final: float, eps_final_min: float | None) -> torch.Tensor:
    """Per-env final epsilons, log-spaced from ``eps_final_min`` (env 0) to ``eps_final`` (env n-1).

    With ``eps_final_min=None`` every env gets ``eps_final``.
    """
    if eps_final_min is None or n_envs == 1:
        return torch.full((n_envs,), float(eps_final))
    if not 0 < eps_final_min <= eps_final:
        raise ValueError(f"need 0 < eps_final_min <= eps_final, got {eps_final_min} and {eps_final}")
    return torch.logspace(math.log10(eps_final_min), math.log10(eps_final), n_envs)


def linear_epsilon(
    frames: int, eps_init: float | torch.Tensor, eps_final: float | torch.Tensor, start_frames: int, end_frames: int
) -> torch.Tensor:
    """Epsilon after ``frames`` env frames: ``eps_init`` until ``start_frames``, linear to ``eps_final`` at
    ``end_frames``, constant after."""
    eps_init_t, eps_final_t = torch.as_tensor(eps_init), torch.as_tensor(eps_final)
    if end_frames <= start_frames:
        frac = 1.0 if frames >= start_frames else 0.0
    else:
        frac = min(max((frames - start_frames) / (end_frames - start_frames), 0.0), 1.0)
    return (eps_init_t + frac * (eps_final_t - eps_init_t)).float()


class EpsilonGreedy(TensorDictModuleBase):
    """Replace the greedy ``action`` by a uniform random action with probability epsilon, per env; append it to a
    greedy Q actor: ``ActingSequential(q_actor, EpsilonGreedy(n_actions, ...))``.

    Epsilon is ``eps_init`` until ``start_frames`` (rlpyt's ``min_steps_learn``), then linear to ``eps_final`` at
    ``end_frames``; with ``eps_final_min``, env ``i`` of ``n_envs`` anneals to its own final value (vector epsilon), and
    the module also reads ``("collector", "env_index")`` (tdrl's collectors provide it) so a worker's copy acting for a
    slice of the envs uses their epsilons. ``eps_eval`` applies under any exploration type but RANDOM. Epsilon lives in
    a buffer (``eps``): it travels with ``state_dict()`` and weight syncs; :meth:`set_frames` moves it along.
    """

    def __init__(self, n_actions: int, *, eps_init: float = 1.0, eps_final: float = 0.01,
            eps_final_min: float | None = None, n_envs: int = 1, start_frames: int = 0, end_frames: int = 1_000_000,
            eps_eval: float = 0.001, action_key: NestedKey = "action") -> None:
        super().__init__()
        if n_actions < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        for name, value in (("eps_init", eps_init), ("eps_final", eps_final), ("eps_eval", eps_eval)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.vector = eps_final_min is not None
        self.in_keys = [action_key, ENV_INDEX_KEY] if self.vector else [action_key]
        self.out_keys = [action_key]
        self.action_key = action_key
        self.n_actions = int(n_actions)
        self.start_frames, self.end_frames = int(start_frames), int(end_frames)
        final = vector_epsilon(n_envs, eps_final, eps_final_min) if self.vector else torch.tensor(float(eps_final))
        self.register_buffer("eps_init", torch.tensor(float(eps_init)))
        self.register_buffer("eps_final", final)
        self.register_buffer("eps", torch.full_like(final, float(eps_init)))
        self.register_buffer("eps_eval", torch.tensor(float(eps_eval)))

    def set_frames(self, frames: int) -> None:
        """Set epsilon to its scheduled value after ``frames`` env frames (call once per iteration)."""
        self.eps.copy_(linear_epsilon(frames, self.eps_init, self.eps_final, self.start_frames, self.end_frames))

    def explore(self, action: torch.Tensor, deterministic: bool, env_index: torch.Tensor | None = None) -> torch.Tensor:
        """``action`` with each entry replaced by a uniform random action with probability epsilon (``eps_eval``
        when ``deterministic``); ``env_index`` picks the envs' epsilons from a vector."""
        eps = self.eps_eval if deterministic else self.eps
        if eps.ndim and env_index is not None:
            eps = eps[env_index]
        shape = action.shape
        if eps.ndim and (not shape or shape[-1] != eps.shape[-1]):
            raise ValueError(
                f"vector epsilon is set for {eps.shape[-1]} envs but the action batch is {tuple(shape)}: build "
                "EpsilonGreedy with n_envs equal to the number of envs, or pass ('collector', 'env_index')"
            )
        explore = torch.rand(shape, device=action.device) < eps.to(action.device)
        if explore.any():
            random_action = torch.randint(self.n_actions, shape, device=action.device, dtype=action.dtype)
            action = torch.where(explore, random_action, action)
        return action

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self.explore(tensordict.get(self.action_key), _deterministic(), tensordict.get(ENV_INDEX_KEY, None))
        return tensordict.set(self.action_key, action)

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        return {self.action_key: self.explore(inputs[self.action_key], deterministic, inputs.get(ENV_INDEX_KEY))}


def _deterministic() -> bool:
    """Whether TorchRL's current exploration type turns exploration off (anything but RANDOM)."""
    return exploration_type() not in (ExplorationType.RANDOM, None)


class GaussianNoise(TensorDictModuleBase):
    """Adds ``N(0, std)`` noise (``std`` per action dimension, in action units) to ``action`` and clamps it into
    ``[low, high]``, under RANDOM exploration only.
    """

    def __init__(self, std: torch.Tensor, low: torch.Tensor, high: torch.Tensor, action_key: NestedKey = "action"):
        super().__init__()
        self.in_keys, self.out_keys, self.action_key = [action_key], [action_key], action_key
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def add_noise(self, action: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return action
        return torch.clamp(action + torch.randn_like(action) * self.std, self.low, self.high)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set(self.action_key, self.add_noise(tensordict.get(self.action_key), _deterministic()))

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        return {self.action_key: self.add_noise(inputs[self.action_key], deterministic)}


def make_gaussian_noise(specs, *, std: float = 0.1, action_key: NestedKey = "action") -> GaussianNoise:
    """Additive Gaussian exploration noise for deterministic policies (DDPG, TD3), clipped to the action box.

    The noise std is ``std`` times the half-width of the action box, so ``std=0.1`` means 10 % of the range
    whatever the env's units (rlpyt's ``action_std`` on a [-1, 1] box; SB3's ``NormalActionNoise``), constant over
    training as in rlpyt and the TD3 paper.
    """
    spec = specs.action_spec
    if not spec.dtype.is_floating_point or not hasattr(spec.space, "low"):
        raise ValueError(
            f"Gaussian action noise needs a bounded continuous action space, got {type(spec).__name__}"
        )
    low, high = spec.space.low.float(), spec.space.high.float()
    return GaussianNoise(std * (high - low) / 2, low, high, action_key)
