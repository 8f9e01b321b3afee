"""The hot loop: step a slice of gymnasium envs in plain Python, writing into numpy views of a ``[B]`` *step
TensorDict* (in shared memory when workers are used):

=============================  =====================================================================
``observation``                the observation the policy sees next (the reset observation after a done)
``("next", "observation")``    the observation the last step returned (the *final* one at a done)
``("next", "reward")``         ``[B, 1]`` float32 env reward
``("next", "terminated")``     ``[B, 1]`` bool;  ``truncated`` and ``done`` likewise
``is_init``                    ``[B, 1]`` bool, True where ``observation`` starts an episode
=============================  =====================================================================

An env may end the *episode* the agent sees before the *game* it plays, as rlpyt's Atari ``episodic_lives`` does
(:class:`tdrl.envs.atari.EpisodicLives`): at a done step, ``info["traj_done"]`` False says the game goes on. The
agent still sees the done (``is_init`` after it, no bootstrap across it), but the TrajInfo runs to the game's end,
so its ``Return``/``GameScore`` is the game score. ``info`` is read at done steps only (a game ends only where an
episode does), so envs that never set it pay nothing per step.

Actions outside a bounded ``Box`` action space are clipped to its bounds before ``env.step`` (SB3 does; CleanRL's
``ClipAction``): an unsquashed Gaussian policy's samples reach the env as valid actions (MuJoCo's control cost is
computed on the action as given), and the batch keeps the sampled action, whose log-probability the loss needs.

Env ``i`` of a collector seeded ``s`` is reset with ``env_seed(s, i)``, so it gets the same stream whichever
worker steps it: this is what makes the parallel collectors reproduce the serial one exactly.

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

from tdrl.collect.traj_info import EpisodeTracker
from tdrl.envs.state import capture_problem, get_env_state, set_env_state

__all__ = ["STEP_NEXT_KEYS", "ArrayTree", "EnvSlice", "action_arrays", "action_keys", "env_seed", "group_keys",
           "make_step_td", "observation_keys", "policy_observation"]

FLAGS = ("done", "terminated", "truncated")
STEP_NEXT_KEYS = (("next", "observation"), ("next", "reward"), *(("next", flag) for flag in FLAGS))
GROUP_NEXT = ("reward", *FLAGS)  # the per-agent entries an agent group has under "next" only
BOOL_LEAVES = ("mask", "action_mask")  # stored as bool whatever the space's dtype (MultiBinary: int8)
RESERVED = ("is_init", "next", "action", "collector", "prev_reward", *GROUP_NEXT)  # root keys the collector writes


def env_seed(seed: int, env_index: int) -> int:
    """Seed of env ``env_index`` in a collector seeded ``seed`` (independent streams per env)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, env_index]).generate_state(1)[0])


def make_step_td(n_envs: int, obs_spec: TensorSpec) -> TensorDict:
    """The zero ``[n_envs]`` step TensorDict of an env whose observation spec is ``obs_spec`` (a ``Composite``: one
    entry per leaf, agent groups with their per-agent ``next`` entries; see the module docstring)."""
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
    for key in list(obs.keys(True, True)):
        if (key[-1] if isinstance(key, tuple) else key) in BOOL_LEAVES:
            obs.set(key, obs.get(key).bool())
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


def _observation_views(rows: TensorDictBase, composite: bool) -> tuple[Any, Any]:
    """Views of ``observation`` and ``("next", "observation")`` (with a group's per-agent next entries)."""
    if not composite:
        return rows["observation"].numpy(), rows["next", "observation"].numpy()
    obs = ArrayTree({key: rows.get(key).numpy() for key in observation_keys(rows)})
    next_rows = rows.get("next")
    next_keys = [key for key in next_rows.keys(True, True) if key not in GROUP_NEXT]  # the root flags: scalar path
    return obs, ArrayTree({key: next_rows.get(key).numpy() for key in next_keys})


class EnvSlice:
    """Owns envs ``lo:hi`` of a collector, whose step arrays are ``rows`` (a ``[hi - lo]`` step TensorDict of
    views), and steps them one at a time.

    ``settings`` is the collector's :class:`~tdrl.collect.runner.SliceSettings`; ``batch_T`` sizes the per-batch
    reward/done record the episode statistics are computed from. With ``defer_resets`` a done env is not reset by
    :meth:`step`: the caller resets it (:meth:`reset_rows`) once a transform has seen the step
    (:mod:`tdrl.collect.transform`).
    """

    def __init__(self, settings: Any, lo: int, hi: int, rows: TensorDictBase, *, batch_T: int,
                 defer_resets: bool = False) -> None:
        self.lo, self.hi = lo, hi
        self.wait_reset = settings.wait_reset
        self.defer_resets = defer_resets
        n = hi - lo
        self.seeds = [env_seed(settings.seed, i) for i in range(lo, hi)]
        self.envs = [settings.env_factory() for _ in range(n)]
        composite = bool(self.envs) and isinstance(self.envs[0].observation_space, gym.spaces.Dict)
        self.obs, self.next_obs = _observation_views(rows, composite)
        # random actions respect the observation's action masks (TorchRL's random policy does)
        self.masked = composite and any("action_mask" in ((k,) if isinstance(k, str) else k) for k in self.obs.leaves)
        self.is_init = rows["is_init"].numpy()[:, 0]
        self.reward = rows["next", "reward"].numpy()[:, 0]
        self.done = rows["next", "done"].numpy()[:, 0]
        self.terminated = rows["next", "terminated"].numpy()[:, 0]
        self.truncated = rows["next", "truncated"].numpy()[:, 0]
        self.idle = np.zeros(n, dtype=bool)
        self.rewards_block = np.zeros((n, batch_T), dtype=np.float32)
        self.dones_block = np.zeros((n, batch_T), dtype=bool)
        self.game_goes_on: list[tuple[int, int]] = []  # (env, step) of this batch's dones with traj_done False
        self.tracker = EpisodeTracker(n, discount=settings.discount, game_score=settings.game_score)
        self.episode_count = np.zeros(n, dtype=np.int64)
        self.action_bounds = _box_bounds(self.envs[0].action_space) if self.envs else None

    def start(self, max_decorrelation_steps: int = 0) -> None:
        """Reset every env with its seed, then take ``U[0, max_decorrelation_steps]`` random steps per env (drawn
        from the env's seed). They are not batch data: episodes they finish are dropped, a running one keeps its
        sums. Every env is then marked ``is_init`` (recurrent policies start from zero state)."""
        n = len(self.envs)
        high = max(max_decorrelation_steps, 0) + 1
        counts = [int(np.random.default_rng(s).integers(0, high)) for s in self.seeds]
        rewards = np.zeros((n, max(counts)), np.float32)
        game_ends = np.zeros_like(rewards, bool)
        for i, env in enumerate(self.envs):
            self.obs[i], _ = env.reset(seed=self.seeds[i])
            env.action_space.seed(self.seeds[i])
            for k in range(counts[i]):
                mask = _action_mask(env.action_space, self.obs[i]) if self.masked else None
                action = env.action_space.sample() if mask is None else env.action_space.sample(mask=mask)
                obs, rewards[i, k], term, trunc, info = env.step(action)
                if term or trunc:
                    game_ends[i, k] = info.get("traj_done", True)
                    obs, _ = env.reset()
                self.obs[i] = obs
        if rewards.size:
            self.tracker.add(rewards, game_ends, np.arange(rewards.shape[1]) < np.asarray(counts)[:, None], keep=False)
        self.is_init[:] = True

    def sample_actions(self, out: np.ndarray) -> None:
        """Random actions from each env's (seeded) action space, for ``policy=None``; within the observation's
        action masks where it has them."""
        if self.masked:
            for i, env in enumerate(self.envs):
                out[i] = env.action_space.sample(mask=_action_mask(env.action_space, self.obs[i]))
            return
        for i, env in enumerate(self.envs):
            out[i] = env.action_space.sample()

    def step(self, t: int, actions: np.ndarray) -> None:
        """Step every (non-idle) env once with ``actions[i]`` and fill the step arrays.

        Reset-at-once: a done env is reset at once (``("next", "observation")`` keeps its final observation,
        ``observation`` gets the reset one). Wait-reset: a done env idles until :meth:`finish_batch` (the batch
        masks those steps). A done whose ``info["traj_done"]`` is False is noted: its game goes on.
        """
        envs = self.envs
        next_obs, reward, terminated, truncated = self.next_obs, self.reward, self.terminated, self.truncated
        resets: list[tuple[int, Any]] = []
        idle = self.idle
        wait_reset = self.wait_reset
        reset_now = not (wait_reset or self.defer_resets)
        if self.action_bounds is not None:
            actions = np.clip(actions, *self.action_bounds)  # a copy: the batch keeps the policy's actions
        for i in range(len(envs)):
            if wait_reset and idle[i]:
                continue
            obs, r, term, trunc, info = envs[i].step(actions[i])
            next_obs[i] = obs
            reward[i] = r
            terminated[i] = term
            truncated[i] = trunc
            if term or trunc:
                if not info.get("traj_done", True):
                    self.game_goes_on.append((i, t))
                if wait_reset:
                    idle[i] = True
                elif reset_now:
                    resets.append((i, envs[i].reset()[0]))
        np.logical_or(terminated, truncated, out=self.done)
        self.is_init[:] = False
        self.obs[:] = next_obs
        for i, obs in resets:
            self.obs[i] = obs
            self.is_init[i] = True
        self.rewards_block[:, t] = reward
        self.dones_block[:, t] = self.done

    def reset_rows(self, rows: np.ndarray) -> None:
        """Reset the envs ``rows`` marks (a ``[n]`` bool mask) now: their ``observation`` is the reset one, with
        ``is_init``, and wait-reset idle envs among them play again."""
        for i in np.flatnonzero(rows):
            self.obs[i], _ = self.envs[i].reset()
            self.is_init[i] = True
        self.idle[rows] = False

    def end_episodes(self, t: int, done: np.ndarray) -> None:
        """Step ``t`` ended the episodes ``done`` marks (a transform's done flags: ``StepCounter`` truncates)."""
        self.dones_block[:, t] = done
        if self.wait_reset:
            self.idle |= done

    def batch_traj_infos(self, valid: np.ndarray | None) -> list[tuple[int, int, dict[str, float]]]:
        """Games finished in this batch as ``(t, global_env_index, traj_info)``: episodes, unless the env said
        ``traj_done`` False at their end (then the TrajInfo continues with the game)."""
        game_ends = self.dones_block
        if self.game_goes_on:
            game_ends = game_ends.copy()
            game_ends[tuple(np.array(self.game_goes_on).T)] = False
            self.game_goes_on.clear()
        done = self.tracker.add(self.rewards_block, game_ends, valid)
        return [(t, self.lo + i, info) for t, i, info in done]

    def valid_mask(self) -> np.ndarray:
        """``[n, T]`` validity of this batch's steps (wait-reset: steps after an env's done are invalid)."""
        if not self.wait_reset:
            return np.ones_like(self.dones_block)
        after = np.cumsum(self.dones_block, axis=1) - self.dones_block
        return after == 0

    def traj_ids(self, n_total: int) -> np.ndarray:
        """``[n, T]`` episode ids: ``episode_number * n_total + env_index`` (unique per collector), then
        advance the per-env episode counters past this batch."""
        starts = np.cumsum(self.dones_block, axis=1) - self.dones_block
        if self.wait_reset:
            starts = np.minimum(starts, 0)
        ids = (self.episode_count[:, None] + starts) * n_total + np.arange(self.lo, self.hi)[:, None]
        self.episode_count += self.dones_block.sum(1) if not self.wait_reset else self.dones_block.any(1)
        return ids

    def finish_batch(self) -> None:
        """Wait-reset: reset the envs that finished during the batch (their next ``observation`` is fresh)."""
        if not self.wait_reset:
            return
        self.reset_rows(self.idle.copy())

    def state_dict(self) -> dict[str, Any]:
        """What the next batch reads (call between batches): each env's state (``None`` for an env whose state
        cannot be captured, see :func:`tdrl.envs.state.capture_problem`), the ``observation``/``is_init`` rows,
        wait-reset idle flags, the last step's rewards (a policy's ``prev_reward``), the running sums of the
        episodes in progress and the per-env episode counters."""
        return {
            "envs": [None if capture_problem(env) else get_env_state(env) for env in self.envs],
            "observation": self.obs.copy(), "is_init": self.is_init.copy(), "idle": self.idle.copy(),
            "reward": self.reward.copy(),
            "episodes": self.tracker.state_dict(), "episode_count": self.episode_count.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of a slice built with the same settings (its envs were reset at
        start; this overwrites them). An env saved as ``None`` keeps the fresh episode it started here: its
        observation, ``is_init`` and episode sums stay as built; its episode counter is restored (unique ids)."""
        if len(state["envs"]) != len(self.envs):
            raise ValueError(f"saved slice has {len(state['envs'])} envs, this one {len(self.envs)}")
        restored = np.array([env_state is not None for env_state in state["envs"]], dtype=bool)
        for env, env_state in zip(self.envs, state["envs"], strict=True):
            if env_state is not None:
                set_env_state(env, env_state)
        for dst, key in ((self.obs, "observation"), (self.is_init, "is_init"), (self.idle, "idle"),
                         (self.reward, "reward")):
            if isinstance(dst, ArrayTree):
                dst.load(restored, state[key])
            elif key in state:  # checkpoints written before "reward" was saved resume with zero prev_reward
                dst[restored] = np.asarray(state[key])[restored]  # in place: the step arrays are shared views
        self.tracker.load_state_dict(state["episodes"], restored)
        self.episode_count[:] = state["episode_count"]

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # closing is best effort; a broken env must not mask the original error
                pass
        self.envs = []


def _action_mask(space: gym.Space, obs: Any) -> Any:
    """The ``mask=`` of ``space.sample`` from an env's observation dict: a ``Discrete`` space's from its
    ``action_mask``, a ``MultiDiscrete`` (an agent group's actions) one row per agent, a ``Dict`` (a multi-agent
    env's ``{group: {"action": ...}}``) per key from the group's entry; ``None`` where there is none."""
    if isinstance(space, gym.spaces.Dict):
        masks = {key: _action_mask(sub, obs.get(key, obs) if isinstance(sub, gym.spaces.Dict) else obs)
                 for key, sub in space.spaces.items()}
        return masks if any(mask is not None for mask in masks.values()) else None
    mask = obs.get("action_mask") if isinstance(obs, Mapping) else None
    if mask is None:
        return None
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(np.asarray(row, np.int8) for row in mask)
    return np.asarray(mask, np.int8) if isinstance(space, gym.spaces.Discrete) else None


def _box_bounds(space: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(low, high)`` of a ``Box`` action space bounded on every side, else ``None``."""
    if isinstance(space, gym.spaces.Box) and np.isfinite(space.low).all() and np.isfinite(space.high).all():
        return space.low, space.high
    return None
