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

Composite observations (dict observations, agent groups) are laid out by :mod:`tdrl.collect.layout`; a plain
array observation keeps the single-array path, the hot loop's fast path.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from tensordict import TensorDictBase

from tdrl.collect.layout import FLAGS, ArrayTree, action_mask, group_keys, make_step_td, observation_views
from tdrl.collect.traj_info import EpisodeTracker, group_name
from tdrl.envs.state import capture_problem, get_env_state, set_env_state

__all__ = ["STEP_NEXT_KEYS", "EnvSlice", "env_seed", "make_step_td"]

STEP_NEXT_KEYS = (("next", "observation"), ("next", "reward"), *(("next", flag) for flag in FLAGS))


def env_seed(seed: int, env_index: int) -> int:
    """Seed of env ``env_index`` in a collector seeded ``seed`` (independent streams per env)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, env_index]).generate_state(1)[0])


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
        self.obs, self.next_obs = observation_views(rows, composite)
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
        self.groups = group_keys(rows) if composite else []  # agent groups: TrajInfos add each one's return
        self.tracker = EpisodeTracker(n, discount=settings.discount, game_score=settings.game_score,
                                      groups=[group_name(key) for key in self.groups])
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
        group_rewards = np.zeros((len(self.groups), *rewards.shape))
        for i, env in enumerate(self.envs):
            self.obs[i], _ = env.reset(seed=self.seeds[i])
            env.action_space.seed(self.seeds[i])
            for k in range(counts[i]):
                mask = action_mask(env.action_space, self.obs[i]) if self.masked else None
                action = env.action_space.sample() if mask is None else env.action_space.sample(mask=mask)
                obs, rewards[i, k], term, trunc, info = env.step(action)
                group_rewards[:, i, k] = [_leaf(obs, key)["reward"].sum() for key in self.groups]
                if term or trunc:
                    game_ends[i, k] = info.get("traj_done", True)
                    obs, _ = env.reset()
                self.obs[i] = obs
        if rewards.size:
            by_group = {group_name(key): r for key, r in zip(self.groups, group_rewards, strict=True)}
            self.tracker.add(rewards, game_ends, np.arange(rewards.shape[1]) < np.asarray(counts)[:, None], keep=False,
                             group_rewards=by_group)
        self.is_init[:] = True

    def sample_actions(self, out: np.ndarray) -> None:
        """Random actions from each env's (seeded) action space, for ``policy=None``; within the observation's
        action masks where it has them."""
        if self.masked:
            for i, env in enumerate(self.envs):
                out[i] = env.action_space.sample(mask=action_mask(env.action_space, self.obs[i]))
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

    def batch_traj_infos(self, valid: np.ndarray | None, group_rewards: dict[str, np.ndarray] | None = None
                         ) -> list[tuple[int, int, dict[str, float]]]:
        """Games finished in this batch as ``(t, global_env_index, traj_info)``: episodes, unless the env said
        ``traj_done`` False at their end (then the TrajInfo continues with the game). An env with agent groups
        passes their ``[n, T]`` rewards (:func:`tdrl.collect.traj_info.group_rewards` of the batch)."""
        game_ends = self.dones_block
        if self.game_goes_on:
            game_ends = game_ends.copy()
            game_ends[tuple(np.array(self.game_goes_on).T)] = False
            self.game_goes_on.clear()
        done = self.tracker.add(self.rewards_block, game_ends, valid, group_rewards=group_rewards)
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


def _leaf(obs: Any, key: Any) -> Any:
    """The entry at ``key`` (a string or a nested key) of an env's observation dict."""
    for name in (key,) if isinstance(key, str) else key:
        obs = obs[name]
    return obs


def _box_bounds(space: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(low, high)`` of a ``Box`` action space bounded on every side, else ``None``."""
    if isinstance(space, gym.spaces.Box) and np.isfinite(space.low).all() and np.isfinite(space.high).all():
        return space.low, space.high
    return None
