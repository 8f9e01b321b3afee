"""Gymnasium environments by id, as picklable constructors.

Collectors step plain gymnasium envs inside worker processes (the fast path), so an environment is described by
an :class:`EnvFactory`, a small picklable value that builds the env in whichever process calls it. Specs are
TorchRL specs, so models and losses are built the TorchRL way.
"""

from __future__ import annotations

import difflib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torchrl.data import Bounded, Categorical, Composite, MultiCategorical, TensorSpec, Unbounded

from tdrl.envs import atari, pomdp
from tdrl.envs.state import capture_problem
from tdrl.envs.time_limit import TimeLimit
from tdrl.utils.errors import UserError

__all__ = ["EnvError", "EnvFactory", "EnvSpecs", "TimeLimit", "make_env", "space_to_spec"]


class EnvError(UserError):
    """An environment cannot be built; the message says why and what to install."""


def _is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")


def _is_minatar(env_id: str) -> bool:
    return env_id.startswith("MinAtar/")


def _check_registered(env_id: str) -> None:
    if _is_atari(env_id):
        try:
            import ale_py  # noqa: F401  (registers the ALE/ ids)

            gym.register_envs(ale_py)
        except ImportError:
            hint = f"environment '{env_id}' is an Atari game and needs ale-py: pip install 'tdrl[atari]'"
            raise EnvError(hint) from None
    if env_id.startswith("tdrl/"):
        pomdp.register_pomdps()
    if _is_minatar(env_id):
        try:
            atari.register_minatar()
        except ImportError:
            raise EnvError(f"environment '{env_id}' needs minatar: pip install 'tdrl[minatar]'") from None
    if env_id not in gym.registry:
        near = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        raise EnvError(f"unknown environment id '{env_id}'{hint}")


def _is_mujoco(env_id: str) -> bool:
    entry = gym.registry[env_id].entry_point
    where = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
    return "mujoco" in where


def _mujoco_warning(message: str) -> None:
    """MuJoCo's warning callback: a Python ``RuntimeWarning`` ``MuJoCo - <message>`` (no colon: a
    ``PYTHONWARNINGS`` filter cannot name a message with one, :mod:`tdrl.utils.console`). It must not raise (an
    exception crossing MuJoCo's C callback aborts the process), so where warnings are errors it prints instead."""
    try:
        warnings.warn(f"MuJoCo - {message}", RuntimeWarning, stacklevel=1)
    except Exception:
        try:
            print(f"MuJoCo warning: {message}", file=sys.stderr)
        except Exception:  # no usable stderr (interpreter shutdown): drop the message rather than abort
            pass


def _route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to Python's ``warnings`` (shown once, filterable) instead of stderr plus a
    ``MUJOCO_LOG.TXT`` in the working directory once per env built. Keeps a handler installed before."""
    try:
        import mujoco
    except ImportError:  # gymnasium.make then raises DependencyNotInstalled, with the pip hint below
        return
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def _make_limited(env_id: str, max_episode_steps: int | None, kwargs: dict[str, Any]) -> gym.Env:
    """``gymnasium.make`` with tdrl's :class:`TimeLimit` in place of gymnasium's (same place, same limit: the
    argument, else the registered one; -1 means none)."""
    env = gym.make(env_id, max_episode_steps=-1, **kwargs)
    limit = gym.spec(env_id).max_episode_steps if max_episode_steps is None else max_episode_steps
    return env if limit is None or limit == -1 else TimeLimit(env, limit)


def make_env(env_id: str, seed: int | None = None, max_episode_steps: int | None = None, **kwargs: Any) -> gym.Env:
    """Build one gymnasium env by id, seeded (first reset and action space), with the family's preprocessing.

    Atari ids get the standard DQN preprocessing (no-op reset, frame skip 4 with 2-frame max, 84×84 grey,
    4-frame stack, uint8; no reward clipping and no episodic life unless asked: the algorithm clips, and the game
    score stays the return) with rlpyt's options as ``kwargs`` (:mod:`tdrl.envs.atari`). MuJoCo ids first route
    MuJoCo's warnings to Python. ``kwargs`` go to ``gymnasium.make``; the time limit (``max_episode_steps``,
    default the registered one; Atari: the horizon in agent steps) is tdrl's :class:`TimeLimit`, so that
    :func:`tdrl.envs.get_env_state` can capture it.
    Raises :class:`EnvError` for an unknown id (naming the nearest ids) or a missing extra (with the pip command).
    """
    _check_registered(env_id)
    try:
        if _is_atari(env_id):
            horizon = {} if max_episode_steps is None else {"horizon": max_episode_steps}  # agent steps
            env = atari.make_atari(env_id, **horizon, **kwargs)
        elif _is_minatar(env_id):
            env = atari.make_minatar(env_id, **kwargs)
        else:
            if _is_mujoco(env_id):
                _route_mujoco_warnings()
            env = _make_limited(env_id, max_episode_steps, kwargs)
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(
            f"environment '{env_id}' needs an extra: {e}. "
            "MuJoCo: pip install 'gymnasium[mujoco]'; Atari: pip install 'tdrl[atari]'"
        ) from e
    if seed is not None:
        env.reset(seed=seed)
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
    def is_atari(self) -> bool:
        return _is_atari(self.env_id)


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
