"""Exploration for the Q-learning families: epsilon-greedy and Gaussian action noise, both acting on tensors too.

Both explore under TorchRL's ``ExplorationType.RANDOM`` and step aside under any other type (evaluation), so an
evaluator needs no second policy. :class:`EpsilonGreedy` is tdrl's own because TorchRL's ``EGreedyModule`` has a
scalar epsilon only and anneals from frame 0, where rlpyt holds it, anneals per env (Ape-X) and evaluates with a
small ``eps_eval`` (so a deterministic policy cannot loop forever).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey, unravel_key
from torchrl.envs.utils import ExplorationType, exploration_type

from tdrl.models.acting import Inputs, Outputs
from tdrl.utils.keys import ENV_INDEX_KEY

__all__ = ["ApexEpsilons", "EpsilonGreedy", "GaussianNoise", "apex_epsilon", "linear_epsilon", "make_gaussian_noise",
           "vector_epsilon"]



def vector_epsilon(n_envs: int, eps_final: float, eps_final_min: float | None) -> torch.Tensor:
    """Per-env final epsilons, log-spaced from ``eps_final_min`` (env 0) to ``eps_final`` (env n-1); all
    ``eps_final`` with ``eps_final_min=None``."""
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
    """Replace the greedy ``action`` by a uniform random action with probability epsilon, per env, after a greedy
    Q actor: ``chain_policy(q_actor, EpsilonGreedy(n_actions, ...))``.

    Epsilon is ``eps_init`` until ``start_frames`` (rlpyt's ``min_steps_learn``), then linear to ``eps_final`` at
    ``end_frames``; with ``eps_final_min``, env ``i`` of ``n_envs`` anneals to its own final value (vector epsilon)
    and the module reads ``("collector", "env_index")``, so a worker's copy acting for a slice of the envs uses their
    epsilons. Epsilon is a buffer (``eps``), so it travels with ``state_dict()`` and weight syncs.

    ``action_key``: the action it explores (a multi-agent group's ``(group, "action")`` ``[n, n_agents]``: each agent
    draws on its own); ``action_mask_key``: a bool ``[..., n_actions]`` mask (``(group, "action_mask")``) the random
    actions are drawn from, uniformly over the allowed ones.
    """

    def __init__(self, n_actions: int, *, eps_init: float = 1.0, eps_final: float = 0.01,
            eps_final_min: float | None = None, n_envs: int = 1, start_frames: int = 0, end_frames: int = 1_000_000,
            eps_eval: float = 0.001, action_key: NestedKey = "action", action_mask_key: NestedKey | None = None
            ) -> None:
        super().__init__()
        if n_actions < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        for name, value in (("eps_init", eps_init), ("eps_final", eps_final), ("eps_eval", eps_eval)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.vector = eps_final_min is not None
        self.action_key = unravel_key(action_key)
        self.action_mask_key = unravel_key(action_mask_key) if action_mask_key is not None else None
        self.in_keys = [action_key, *([ENV_INDEX_KEY] if self.vector else []),
                        *([action_mask_key] if action_mask_key is not None else [])]
        self.out_keys = [action_key]
        self.n_actions = int(n_actions)
        self.start_frames, self.end_frames = int(start_frames), int(end_frames)
        final = vector_epsilon(n_envs, eps_final, eps_final_min) if self.vector else torch.tensor(float(eps_final))
        self.register_buffer("eps_init", torch.tensor(float(eps_init)))
        self.register_buffer("eps_final", final)
        self.register_buffer("eps", torch.full_like(final, float(eps_init)))
        self.register_buffer("eps_eval", torch.tensor(float(eps_eval)))

    def fix(self, eps: float) -> None:
        """Explore with ``eps`` from now on, whatever the frame count (an Ape-X actor's own epsilon)."""
        for buffer in (self.eps_init, self.eps_final, self.eps):
            buffer.fill_(float(eps))

    def set_frames(self, frames: int) -> None:
        """Set epsilon to its scheduled value after ``frames`` env frames (call once per iteration)."""
        self.eps.copy_(linear_epsilon(frames, self.eps_init, self.eps_final, self.start_frames, self.end_frames))

    def explore(self, action: torch.Tensor, deterministic: bool, env_index: torch.Tensor | None = None,
                action_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``action`` with each entry replaced by a uniform random action with probability epsilon (``eps_eval``
        when ``deterministic``); ``env_index`` picks the envs' epsilons from a vector; ``action_mask``
        ``[*action.shape, n_actions]``: the random action is one it allows."""
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
            if action_mask is None:
                random_action = torch.randint(self.n_actions, shape, device=action.device, dtype=action.dtype)
            else:  # the largest of uniform draws over the allowed actions: a uniform allowed action
                draws = torch.rand((*shape, self.n_actions), device=action.device) * action_mask
                random_action = draws.argmax(-1).to(action.dtype)
            action = torch.where(explore, random_action, action)
        return action

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        mask = tensordict.get(self.action_mask_key) if self.action_mask_key is not None else None
        action = self.explore(tensordict.get(self.action_key), _deterministic(), tensordict.get(ENV_INDEX_KEY, None),
                              mask)
        return tensordict.set(self.action_key, action)

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        mask = inputs[self.action_mask_key] if self.action_mask_key is not None else None
        return {self.action_key: self.explore(inputs[self.action_key], deterministic, inputs.get(ENV_INDEX_KEY),
                                              mask)}


def _deterministic() -> bool:
    """Whether TorchRL's current exploration type turns exploration off (anything but RANDOM)."""
    return exploration_type() not in (ExplorationType.RANDOM, None)


class GaussianNoise(TensorDictModuleBase):
    """Adds ``N(0, std)`` noise (``std`` per action dimension, in action units) to ``action`` and clamps it into
    ``[low, high]``, under RANDOM exploration only. With ``pretrain_std``, the std is that until ``start_frames``
    (rlpyt's ``pretrain_std``: wide exploration while nothing is learned; :meth:`set_frames` switches it). The
    std in use is a buffer (``std``), so it travels with ``state_dict()`` and weight syncs.
    """

    def __init__(self, std: torch.Tensor, low: torch.Tensor, high: torch.Tensor, *,
            pretrain_std: torch.Tensor | None = None, start_frames: int = 0) -> None:
        super().__init__()
        self.in_keys, self.out_keys = ["action"], ["action"]
        self.start_frames = int(start_frames)
        self.register_buffer("final_std", torch.as_tensor(std, dtype=torch.float32))
        pretrain = self.final_std if pretrain_std is None else torch.as_tensor(pretrain_std, dtype=torch.float32)
        self.register_buffer("pretrain_std", pretrain.clone())
        self.register_buffer("std", (self.pretrain_std if self.start_frames > 0 else self.final_std).clone())
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def set_frames(self, frames: int) -> None:
        """Use the std for after ``frames`` env frames (call once per iteration)."""
        self.std.copy_(self.pretrain_std if frames < self.start_frames else self.final_std)

    def add_noise(self, action: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return action
        return torch.clamp(action + torch.randn_like(action) * self.std, self.low, self.high)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set("action", self.add_noise(tensordict.get("action"), _deterministic()))

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        return {"action": self.add_noise(inputs["action"], deterministic)}


def make_gaussian_noise(specs, *, std: float = 0.1, pretrain_std: float | None = None,
        start_frames: int = 0) -> GaussianNoise:
    """Additive Gaussian exploration noise for deterministic policies (DDPG, TD3), clipped to the action box.

    Its std is ``std`` times the half-width of the box whatever the env's units (rlpyt's ``action_std`` on a
    [-1, 1] box), constant over training as in rlpyt and the TD3 paper; ``pretrain_std`` (same units) replaces it
    until ``start_frames`` env frames (rlpyt's ``pretrain_std`` before ``min_steps_learn``).
    """
    spec = specs.action_spec
    if not spec.dtype.is_floating_point or not hasattr(spec.space, "low"):
        raise ValueError(
            f"Gaussian action noise needs a bounded continuous action space, got {type(spec).__name__}"
        )
    low, high = spec.space.low.float(), spec.space.high.float()
    half_width = (high - low) / 2
    return GaussianNoise(std * half_width, low, high, start_frames=start_frames,
                         pretrain_std=None if pretrain_std is None else pretrain_std * half_width)


def apex_epsilon(index: int, n_actors: int, *, eps: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's epsilon of actor ``index`` of ``n_actors``: ``eps ** (1 + alpha * index / (n_actors - 1))``."""
    return eps ** (1 + alpha * index / (n_actors - 1)) if n_actors > 1 else eps


class ApexEpsilons:
    """``trainer.kind=ray`` actor setup: fixes every :class:`EpsilonGreedy` of actor ``index``'s policy at
    :func:`apex_epsilon` (picklable; the learner publishes the Q-network only, so it stays)."""

    def __init__(self, eps: float = 0.4, alpha: float = 7.0) -> None:
        self.eps, self.alpha = eps, alpha

    def __call__(self, policy: torch.nn.Module, index: int, n_actors: int) -> None:
        modules = [m for m in policy.modules() if isinstance(m, EpsilonGreedy)]
        if not modules:
            raise ValueError("ApexEpsilons found no EpsilonGreedy module in the actor's policy")
        for module in modules:
            module.fix(apex_epsilon(index, n_actors, eps=self.eps, alpha=self.alpha))
