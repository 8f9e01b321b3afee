"""The layout of a collector's step: which TensorDict entries an env's observation spec gives, and numpy views of
them the hot loop writes (:mod:`tdrl.collect.stepping`).

A plain array observation is ``observation`` and ``("next", "observation")`` (one array each: the fast path).

**Composite observations.** An env with a ``Dict`` observation space (its spec a ``Composite``) gets one entry per
leaf, named as in TorchRL's ``GymEnv``: a gymnasium ``{"observation": ..., "action_mask": ...}`` becomes the root
keys ``observation`` and ``action_mask`` (and ``("next", "observation")``...), a nested ``Dict`` nested keys. Leaves
named ``mask`` or ``action_mask`` are stored as bool (TorchRL's masked distributions read ``action_mask``). A
sub-``Dict`` with a ``mask`` entry of shape ``[n]`` is an *agent group* (TorchRL's multi-agent convention,
:mod:`tdrl.envs.multiagent`): its entries are ``[B, n, ...]`` (the group's TensorDict has batch size ``[B, n]``),
``(group, "mask")`` says which agents are present (act) at that observation, and under ``next`` the group also has
the per-agent ``("next", group, "reward")`` ``[B, n, 1]`` and ``("next", group, "done" / "terminated" /
"truncated")`` ``[B, n, 1]``, which the env returns inside the group's entry of its step observation (beside
``observation`` and ``mask``). The root ``("next", "reward")`` and done flags stay the episode's: the reward the
env returns (a multi-agent env: the sum over agents) and whether the episode ended. Composite envs step through
:class:`ArrayTree` views (one numpy view per leaf); a plain array observation keeps its single-array path, which
is the hot loop's fast path. A composite action spec (a multi-agent env's ``(group, "action")``) is read from the
batch the same way and handed to ``env.step`` as the nested dict its ``Dict`` action space samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import Composite, TensorSpec

__all__ = ["FLAGS", "ArrayTree", "action_arrays", "action_keys", "action_mask", "group_keys", "make_step_td",
           "observation_keys", "observation_views", "policy_observation"]

FLAGS = ("done", "terminated", "truncated")
GROUP_NEXT = ("reward", *FLAGS)  # the per-agent entries an agent group has under "next" only
BOOL_LEAVES = ("mask", "action_mask")  # stored as bool whatever the space's dtype (MultiBinary: int8)
RESERVED = ("is_init", "next", "action", "collector", "prev_reward", *GROUP_NEXT)  # root keys the collector writes


def make_step_td(n_envs: int, obs_spec: TensorSpec) -> TensorDict:
    """The zero ``[n_envs]`` step TensorDict of an env whose observation spec is ``obs_spec`` (a ``Composite``: one
    entry per leaf, agent groups with their per-agent ``next`` entries; see the module docstring), its masks all
    True (every action allowed, every agent present: a masked policy probed on it acts)."""
    if isinstance(obs_spec, Composite):
        return _composite_step_td(n_envs, obs_spec)
    obs = obs_spec.zero((n_envs,))
    if not isinstance(obs, torch.Tensor):
        raise TypeError(f"tdrl collectors need an array or Composite observation spec, got {type(obs_spec).__name__}")
    next_ = {"observation": obs.clone(), "reward": torch.zeros(n_envs, 1, dtype=torch.float32),
             **{flag: torch.zeros(n_envs, 1, dtype=torch.bool) for flag in FLAGS}}
    is_init = torch.zeros(n_envs, 1, dtype=torch.bool)
    return TensorDict({"observation": obs, "is_init": is_init, "next": next_}, batch_size=[n_envs])


def _composite_step_td(n_envs: int, obs_spec: Composite) -> TensorDict:
    clash = [key for key in obs_spec.keys() if key in RESERVED]
    if clash:
        raise ValueError(f"the env's observation has entries named {clash}, which the collector writes itself; "
                         "rename them in the env's observation space")
    obs = obs_spec.zero((n_envs,))
    for key in list(obs.keys(True, True)):  # True: a policy probed on the blank step at build can act
        if (key[-1] if isinstance(key, tuple) else key) in BOOL_LEAVES:
            obs.set(key, torch.ones_like(obs.get(key), dtype=torch.bool))
    groups = group_keys(obs)
    for group in groups:
        sub = obs.get(group)
        mask = sub.get("mask")
        if mask.dim() != 2:
            raise ValueError(f"agent group {group!r}: its 'mask' must hold one flag per agent ([n_agents]), got "
                             f"shape {tuple(mask.shape[1:])}")
        clash = [name for name in GROUP_NEXT if name in sub.keys()]
        if clash:
            raise ValueError(f"agent group {group!r} has observation entries named {clash}, which the collector "
                             "writes under 'next'")
        sub.batch_size = mask.shape
    next_ = obs.clone()
    for group in groups:
        sub = next_.get(group)
        shape = (*sub.batch_size, 1)
        sub.set("reward", torch.zeros(shape, dtype=torch.float32))
        for flag in FLAGS:
            sub.set(flag, torch.zeros(shape, dtype=torch.bool))
    next_.set("reward", torch.zeros(n_envs, 1, dtype=torch.float32))
    for flag in FLAGS:
        next_.set(flag, torch.zeros(n_envs, 1, dtype=torch.bool))
    obs.set("is_init", torch.zeros(n_envs, 1, dtype=torch.bool))
    obs.set("next", next_)
    return obs


def group_keys(td: TensorDictBase) -> list[NestedKey]:
    """The agent groups of a step or batch TensorDict: its sub-TensorDicts (outside ``next``) with a ``mask``
    entry."""
    return [key for key in td.keys(True) if key != "next" and not (isinstance(key, tuple) and key[0] == "next")
            and isinstance(td.get(key), TensorDictBase) and "mask" in td.get(key).keys()]


def observation_keys(step_td: TensorDictBase) -> list[NestedKey]:
    """The leaves of a step TensorDict the policy may read: every root entry but ``is_init`` and ``next``."""
    return [key for key in step_td.keys(True, True) if key != "is_init" and not (isinstance(key, tuple)
                                                                                 and key[0] == "next")]


def policy_observation(step_td: TensorDictBase, keys: Sequence[NestedKey]) -> torch.Tensor | dict[NestedKey, Any]:
    """What a policy step reads from ``step_td`` (views, refreshed in place every step): the ``observation``
    tensor when ``keys`` is ``["observation"]``, else the dict of the ``keys`` entries."""
    if list(keys) == ["observation"]:
        return step_td.get("observation")
    return {key: step_td.get(key) for key in keys}


def action_keys(action_spec: TensorSpec) -> list[NestedKey]:
    """The batch keys of an env's actions: ``action``, or the leaves of a composite action spec (a multi-agent
    env's ``(group, "action")``)."""
    if isinstance(action_spec, Composite):
        return list(action_spec.keys(True, True))
    return ["action"]


def action_arrays(batch: TensorDictBase, keys: Sequence[NestedKey], lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of the batch's actions as numpy views: one array for ``["action"]``, else an
    :class:`ArrayTree`."""
    if list(keys) == ["action"]:
        return batch.get("action").numpy()[lo:hi]
    return ArrayTree({key: batch.get(key).numpy()[lo:hi] for key in keys})


class ArrayTree:
    """Numpy views of some leaves of a TensorDict, used where the hot loop uses one array: indexing with an int
    gives the nested dict of row ``i`` (an env's action, as its ``Dict`` space samples it); other indices give an
    :class:`ArrayTree` of sub-views. Assigning a nested dict (an env's observation) writes each leaf from its path
    (entries of the dict that are not leaves here are ignored), assigning an :class:`ArrayTree` copies the leaves
    both have."""

    def __init__(self, leaves: dict[NestedKey, np.ndarray]) -> None:
        self.leaves = leaves
        self.paths = [((key,) if isinstance(key, str) else tuple(key), array) for key, array in leaves.items()]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            out: dict[str, Any] = {}
            for path, array in self.paths:
                node = out
                for name in path[:-1]:
                    node = node.setdefault(name, {})
                node[path[-1]] = array[index]
            return out
        return ArrayTree({key: array[index] for key, array in self.leaves.items()})

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, ArrayTree):
            for key, array in self.leaves.items():
                array[index] = value.leaves[key]
            return
        for path, array in self.paths:
            node = value
            for name in path:
                node = node[name]
            array[index] = node

    def copy(self) -> dict[NestedKey, np.ndarray]:
        return {key: array.copy() for key, array in self.leaves.items()}

    def load(self, rows: np.ndarray, saved: Mapping[NestedKey, np.ndarray]) -> None:
        """Copy rows ``rows`` (a bool mask) of :meth:`copy`'s dict into the views."""
        for key, array in self.leaves.items():
            array[rows] = np.asarray(saved[key])[rows]


def observation_views(rows: TensorDictBase, composite: bool) -> tuple[Any, Any]:
    """Views of ``observation`` and ``("next", "observation")`` (with a group's per-agent next entries)."""
    if not composite:
        return rows["observation"].numpy(), rows["next", "observation"].numpy()
    obs = ArrayTree({key: rows.get(key).numpy() for key in observation_keys(rows)})
    next_rows = rows.get("next")
    next_keys = [key for key in next_rows.keys(True, True) if key not in GROUP_NEXT]  # the root flags: scalar path
    return obs, ArrayTree({key: next_rows.get(key).numpy() for key in next_keys})


def action_mask(space: gym.Space, obs: Any) -> Any:
    """The ``mask=`` of ``space.sample`` from an env's observation dict: a ``Discrete`` space's from its
    ``action_mask``, a ``MultiDiscrete`` (an agent group's actions) one row per agent, a ``Dict`` (a multi-agent
    env's ``{group: {"action": ...}}``) per key from the group's entry; ``None`` where there is none."""
    if isinstance(space, gym.spaces.Dict):
        masks = {key: action_mask(sub, obs.get(key, obs) if isinstance(sub, gym.spaces.Dict) else obs)
                 for key, sub in space.spaces.items()}
        return masks if any(mask is not None for mask in masks.values()) else None
    mask = obs.get("action_mask") if isinstance(obs, Mapping) else None
    if mask is None:
        return None
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(np.asarray(row, np.int8) for row in mask)
    return np.asarray(mask, np.int8) if isinstance(space, gym.spaces.Discrete) else None
