"""Atari and MinAtar envs with rlpyt's options, built from gymnasium's wrappers.

:func:`make_atari` takes rlpyt's ``AtariEnv`` options as keyword arguments of ``make_env`` (so an
``EnvFactory("ALE/Pong-v5", {"episodic_lives": True})`` carries them to worker processes):

=============================  =========================================================================
``frame_skip`` (4)             agent steps repeat the action this many frames, max-pooling the last two
``repeat_action_probability``  sticky actions, per frame (0.25 for ``ALE/*-v5``, 0 for ``*NoFrameskip-v4``)
``noop_max`` (30)              up to this many no-op steps after each game reset (rlpyt ``max_start_noops``)
``horizon`` (27000)            agent steps before a game is truncated (rlpyt ``horizon``; ``max_episode_steps``)
``episodic_lives`` (False)     a lost life ends the RL episode, not the game (:class:`EpisodicLives`)
``screen_size``, ``frame_stack``  84x84 grey frames, 4 stacked: uint8 ``[4, 84, 84]`` observations
=============================  =========================================================================

Rewards are the game's (not clipped): the algorithm clips or rescales them, and the episode return is the score.
:func:`make_minatar` builds the ``minatar`` package's games (10x10 images, a CPU-scale Atari family).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from tdrl.envs.time_limit import TimeLimit

__all__ = ["ATARI_DEFAULTS", "EpisodicLives", "make_atari", "make_minatar"]

ATARI_DEFAULTS = {"frame_skip": 4, "noop_max": 30, "horizon": 27_000, "episodic_lives": False, "screen_size": 84,
                  "frame_stack": 4}


class EpisodicLives(gym.Wrapper):
    """rlpyt's ``episodic_lives``: a lost life returns ``terminated=True`` (the agent's recurrent state is reset and
    the TD target stops there), but the game goes on: ``reset()`` after a life loss returns the current observation
    without resetting the game. Only game over or the horizon reset it; ``info["traj_done"]`` says which (rlpyt's
    ``traj_done``). Implements the env-state protocol (``state_dict``/``load_state_dict``) for exact resume.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True
        self.last_observation: np.ndarray | None = None

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        self.game_over = bool(terminated or truncated)
        life_lost = 0 < lives < self.lives
        self.lives, self.last_observation = lives, obs
        info["traj_done"] = self.game_over
        return obs, reward, bool(terminated or life_lost), truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self.game_over or seed is not None or self.last_observation is None:
            obs, info = self.env.reset(seed=seed, options=options)
            self.lives, self.game_over = self.env.unwrapped.ale.lives(), False
            self.last_observation = obs
            return obs, info
        return self.last_observation, {}  # a new life: the game continues where it is

    def state_dict(self) -> dict[str, Any]:
        obs = None if self.last_observation is None else np.array(self.last_observation)
        return {"lives": self.lives, "game_over": self.game_over, "last_observation": obs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lives, self.game_over = int(state["lives"]), bool(state["game_over"])
        obs = state["last_observation"]
        self.last_observation = None if obs is None else np.array(obs)


def make_atari(env_id: str, **kwargs: Any) -> gym.Env:
    """One Atari game by id with rlpyt's options (module docstring; ``horizon`` -1: none);
    other ``kwargs`` go to ``gymnasium.make`` (ALE's own arguments, e.g. ``full_action_space``). Needs
    ``pip install 'tdrl[atari]'`` (ale-py, opencv).

    Every layer can be checkpointed (:mod:`tdrl.envs.state`): sticky actions come from gymnasium's
    ``StickyAction`` right above the emulator (same probability per frame as ALE's own, whose previous action
    ``cloneState`` leaves out), and the horizon is tdrl's :class:`~tdrl.envs.time_limit.TimeLimit` in agent steps.
    """
    options = {key: kwargs.pop(key, default) for key, default in ATARI_DEFAULTS.items()}
    horizon = options.pop("horizon")
    sticky = kwargs.pop("repeat_action_probability", 0.25 if env_id.startswith("ALE/") else 0.0)
    kwargs.setdefault("obs_type", "grayscale")  # the raw frames ALE copies out each frame are unused: 1 byte, not 3
    # frame skipping is the preprocessing's; no limit inside ALE or gymnasium: the TimeLimit below counts agent steps
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=0,
                   max_episode_steps=-1, **kwargs)
    if sticky > 0:
        env = gym.wrappers.StickyAction(env, repeat_action_probability=sticky)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=options["noop_max"], frame_skip=options["frame_skip"],
                                          screen_size=options["screen_size"])
    env = gym.wrappers.FrameStackObservation(env, options["frame_stack"])
    if horizon and horizon > 0:
        env = TimeLimit(env, horizon)
    return EpisodicLives(env) if options["episodic_lives"] else env


class MinAtarImage(gym.ObservationWrapper):
    """MinAtar's ``[10, 10, C]`` bool state as a ``[C, 10, 10]`` uint8 image (0 or 255), the layout and dtype tdrl's
    conv torsos and replay take for frames."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0)).astype(np.uint8) * np.uint8(255)

    def state_dict(self) -> dict[str, Any]:
        return {}  # a pure function of the observation

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def make_minatar(env_id: str, **kwargs: Any) -> gym.Env:
    """A MinAtar game (``MinAtar/Breakout-v1``: minimal action set; ``-v0``: all 6 actions) as uint8 images;
    ``kwargs`` go to ``gymnasium.make`` (e.g. ``sticky_action_prob``, 0.1 by default). Needs ``pip install
    'tdrl[minatar]'``."""
    return MinAtarImage(gym.make(env_id, **kwargs))


def register_minatar() -> None:
    """Register the ``MinAtar/`` ids with gymnasium (the package registers them only when asked)."""
    from minatar.gym import register_envs

    if "MinAtar/Breakout-v1" not in gym.registry:
        register_envs()
