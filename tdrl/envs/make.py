"""Gymnasium environments by id, as picklable constructors.

Collectors step plain gymnasium envs inside worker processes (the fast path), so an environment is described by
an :class:`EnvFactory`, a small picklable value that builds the env in whichever process calls it. Specs are
TorchRL specs, so models and losses are built the TorchRL way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torchrl.data import Bounded, Categorical, Composite, MultiCategorical, TensorSpec, Unbounded

from tdrl.envs.families import EnvError, EnvFamily, EnvTraits, family_of
from tdrl.envs.state import capture_problem
from tdrl.envs.time_limit import TimeLimit

__all__ = ["EnvError", "EnvFactory", "EnvSpecs", "TimeLimit", "make_env", "space_to_spec"]


def make_env(env_id: str, seed: int | None = None, max_episode_steps: int | None = None, **kwargs: Any) -> gym.Env:
    """Build one gymnasium env by id, seeded (first reset and action space), with its family's preprocessing
    (:func:`tdrl.envs.family_of`).

    Atari ids get the standard DQN preprocessing (no-op reset, frame skip 4 with 2-frame max, 84×84 grey,
    4-frame stack, uint8; no reward clipping and no episodic life unless asked: the algorithm clips, and the game
    score stays the return) with rlpyt's options as ``kwargs`` (:mod:`tdrl.envs.atari`). MuJoCo ids first route
    MuJoCo's warnings to Python. ``kwargs`` go to ``gymnasium.make``; the time limit (``max_episode_steps``,
    default the registered one; Atari: the horizon in agent steps) is tdrl's :class:`TimeLimit`, so that
    :func:`tdrl.envs.get_env_state` can capture it.
    Raises :class:`EnvError` for an unknown id (naming the nearest ids) or a missing extra (with the pip command).
    """
    env = family_of(env_id).build(env_id, max_episode_steps, **kwargs)
    if seed is not None:
        env.reset(seed=seed)
        if hasattr(env, "action_space"):  # a batched torch env (VMAS) samples no actions of its own
            env.action_space.seed(seed)
    return env


@dataclass(frozen=True)
class EnvFactory:
    """A picklable constructor of one environment: ``EnvFactory("CartPole-v1")(seed=3)``; ``kwargs`` go to
    ``gymnasium.make``."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, seed: int | None = None) -> gym.Env:
        return make_env(self.env_id, seed=seed, **self.kwargs)

    def specs(self) -> EnvSpecs:
        """TorchRL specs of one env (builds it once, then closes it)."""
        env = self()
        try:
            return EnvSpecs.from_env(env)
        finally:
            env.close()

    @property
    def family(self) -> EnvFamily:
        """The family of ``env_id`` (:func:`tdrl.envs.family_of`)."""
        return family_of(self.env_id)

    @property
    def traits(self) -> EnvTraits:
        """What tdrl does differently for these envs (:class:`tdrl.envs.EnvTraits`: their family's)."""
        return self.family.traits

    @classmethod
    def from_config(cls, env: Any) -> EnvFactory:
        """The factory of a config's env section: ``env.id`` with the family options the section sets
        (``AtariEnvConfig``'s ``episodic_lives``; a section without the field leaves it off). Raises
        :class:`EnvError` for an option the id's family does not take."""
        if not getattr(env, "episodic_lives", False):
            return cls(env.id)
        family = family_of(env.id)
        if not family.traits.episodic_lives:
            raise EnvError(f"env.episodic_lives=true: environment '{env.id}' ({family.name}) has no lives to lose; "
                           "set env.episodic_lives=false")
        return cls(env.id, {"episodic_lives": True})


def space_to_spec(space: gym.Space) -> TensorSpec:
    """Convert a gymnasium space into the TorchRL spec of one env's value (no batch dimension)."""
    if isinstance(space, gym.spaces.Discrete):
        return Categorical(int(space.n), shape=(), dtype=torch.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical(torch.as_tensor(space.nvec), dtype=torch.int64)
    if isinstance(space, gym.spaces.MultiBinary):
        return Bounded(0, 1, shape=space.shape, dtype=torch.int8)
    if isinstance(space, gym.spaces.Box):
        dtype = torch.uint8 if space.dtype == np.uint8 else torch.float32
        low = np.array(np.broadcast_to(space.low, space.shape))
        high = np.array(np.broadcast_to(space.high, space.shape))
        if np.isfinite(low).all() and np.isfinite(high).all():
            return Bounded(torch.as_tensor(low, dtype=dtype), torch.as_tensor(high, dtype=dtype), dtype=dtype)
        return Unbounded(shape=space.shape, dtype=dtype)
    if isinstance(space, gym.spaces.Dict):
        return Composite({k: space_to_spec(v) for k, v in space.spaces.items()})
    raise EnvError(f"unsupported gymnasium space {space!r}")


@dataclass
class EnvSpecs:
    """TorchRL specs of one environment (unbatched): observations float32 (uint8 for images), discrete actions
    int64 indices."""

    observation_spec: TensorSpec
    action_spec: TensorSpec
    max_episode_steps: int | None = None
    capture_problem: str | None = None  # why the env's state cannot be checkpointed (see tdrl.envs.state)

    @classmethod
    def from_env(cls, env: gym.Env) -> EnvSpecs:
        """The specs of a gymnasium env's spaces; an env that is not one (a batched torch env,
        :mod:`tdrl.envs.vmas`) gives its own through ``env_specs()``."""
        own = getattr(env, "env_specs", None)
        if callable(own):
            return own()
        return cls(
            observation_spec=space_to_spec(env.observation_space),
            action_spec=space_to_spec(env.action_space),
            max_episode_steps=getattr(env.spec, "max_episode_steps", None) if env.spec else None,
            capture_problem=capture_problem(env),
        )

    @property
    def discrete(self) -> bool:
        """True for a single discrete action (Categorical spec)."""
        return isinstance(self.action_spec, Categorical)

    @property
    def n_actions(self) -> int:
        """Number of discrete actions, or the continuous action dimension."""
        if self.discrete:
            return int(self.action_spec.space.n)
        return int(np.prod(self.action_spec.shape))
