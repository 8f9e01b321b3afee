"""Atari and MinAtar envs with rlpyt's options; Atari frames come from one layer on ALE's interface.

:func:`make_atari` takes rlpyt's ``AtariEnv`` options as keyword arguments of ``make_env`` (so an
``EnvFactory("ALE/Pong-v5", {"episodic_lives": True})`` carries them to worker processes):

=============================  =========================================================================
``frame_skip`` (4)             agent steps repeat the action this many frames, max-pooling the last two
``repeat_action_probability``  sticky actions, per frame (0.25 for ``ALE/*-v5``, 0 for ``*NoFrameskip-v4``)
``noop_max`` (30)              up to this many no-op frames after each game reset (rlpyt ``max_start_noops``)
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

__all__ = ["AtariFrames", "EpisodicLives", "make_atari", "make_minatar"]

_ATARI_DEFAULTS = {"frame_skip": 4, "noop_max": 30, "horizon": 27_000, "episodic_lives": False, "screen_size": 84,
                   "frame_stack": 4}


class AtariFrames(gym.Wrapper):
    """rlpyt's ``AtariEnv`` as one layer over gymnasium's ``AtariEnv`` (built with ``frameskip=1`` and no sticky
    actions): each agent step drives the emulator (``env.unwrapped.ale``) directly for ``frame_skip`` frames, so
    the per-frame wrapper calls and screen copies of a wrapper stack are gone. It keeps the semantics of
    gymnasium's ``StickyAction`` -> ``AtariPreprocessing`` -> ``FrameStackObservation`` (the stack ``make_atari``
    built before), bitwise, draws included:

    - sticky actions per frame, the previous frame's action repeated with ``repeat_action_probability`` (none on
      the first frame after a reset);
    - ``noop_max`` > 0: after each reset, a number of no-op frames drawn from ``integers(1, noop_max + 1)``, the
      game reset again if it ends during them;
    - the last two frames of a step max-pooled, resized to ``screen_size`` (``cv2.INTER_AREA``), stacked
      ``frame_stack`` deep, a reset filling the stack with its frame; a step that ends the game stops at that
      frame (its observation then pools the frames grabbed before);
    - ``terminated`` on game over only (a lost life is :class:`EpisodicLives`'s business).

    Random draws come from the env's ``np_random``, which ``reset(seed=...)`` seeds, so seeding stays gymnasium's
    and the emulator layer's state (:mod:`tdrl.envs.state`) holds the RNG. This layer's own state is the last
    action and the frame buffers (``state_dict``/``load_state_dict``).
    """

    def __init__(self, env: gym.Env, frame_skip: int = 4, repeat_action_probability: float = 0.0,
                 noop_max: int = 30, screen_size: int | tuple[int, int] = 84, frame_stack: int = 4) -> None:
        try:
            import cv2  # noqa: F401
        except ImportError as e:
            raise gym.error.DependencyNotInstalled("opencv-python is not installed (Atari frame resizing)") from e
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(f"AtariFrames needs discrete actions, got {env.action_space}")
        if frame_skip < 1 or noop_max < 0 or frame_stack < 1 or not 0 <= repeat_action_probability < 1:
            raise ValueError(f"invalid Atari options: {frame_skip=}, {noop_max=}, {frame_stack=}, "
                             f"{repeat_action_probability=}")
        atari: Any = env.unwrapped  # ale_py's AtariEnv (gymnasium's types do not know its ale)
        self.ale = atari.ale
        legal = {action.name: action for action in self.ale.getLegalActionSet()}
        meanings = atari.get_action_meanings()
        if noop_max > 0 and meanings[0] != "NOOP":
            raise ValueError("no-op starts (noop_max > 0) need action 0 to be NOOP")
        self.actions = [legal[name] for name in meanings]  # action index -> ALE action, as the env maps them
        self.frame_skip, self.noop_max = frame_skip, noop_max
        self.repeat_action_probability = repeat_action_probability
        width, height = (screen_size, screen_size) if isinstance(screen_size, int) else screen_size
        self.screen_size = (width, height)
        self.screens = np.zeros((2, *self.ale.getScreenDims()), np.uint8)  # a step's last two frames, pooled in [0]
        self.frames = np.zeros((frame_stack, height, width), np.uint8)
        self.last_action: int | None = None  # what the sticky draw repeats; None right after a reset
        self.observation_space = gym.spaces.Box(0, 255, self.frames.shape, np.uint8)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action, rng, reward = int(action), self.np_random, 0.0
        for t in range(self.frame_skip):
            reward += self.act(action, rng)
            if self.ale.game_over():
                break
            if t >= self.frame_skip - 2:
                self.ale.getScreenGrayscale(self.screens[self.frame_skip - 1 - t])
        terminated, truncated = self.ale.game_over(with_truncation=False), self.ale.game_truncated()
        self.push_frame()
        return self.frames.copy(), reward, terminated, truncated, self.frame_info()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        _, info = self.env.reset(seed=seed, options=options)
        self.last_action = None
        rng = self.np_random
        for _ in range(rng.integers(1, self.noop_max + 1) if self.noop_max > 0 else 0):
            self.act(0, rng)
            if self.ale.game_over():
                _, info = self.env.reset(seed=seed, options=options)
                self.last_action = None
        self.ale.getScreenGrayscale(self.screens[0])
        self.screens[1].fill(0)
        self.push_frame()
        self.frames[:-1] = self.frames[-1]  # the stack starts full of the reset frame
        return self.frames.copy(), {**info, **self.frame_info()}

    def act(self, action: int, rng: np.random.Generator) -> float:
        """One frame of ``action``, or of the previous frame's action with the sticky probability."""
        if self.last_action is None or not (self.repeat_action_probability > 0
                                            and rng.random() < self.repeat_action_probability):
            self.last_action = action
        return self.ale.act(self.actions[self.last_action])

    def push_frame(self) -> None:
        """Pool a step's last two frames and push their resized image onto the stack."""
        import cv2

        if self.frame_skip > 1:
            np.maximum(self.screens[0], self.screens[1], out=self.screens[0])
        self.frames[:-1] = self.frames[1:]
        cv2.resize(self.screens[0], self.screen_size, dst=self.frames[-1], interpolation=cv2.INTER_AREA)

    def frame_info(self) -> dict[str, Any]:
        """The info ALE's env reports."""
        return {"lives": self.ale.lives(), "episode_frame_number": self.ale.getEpisodeFrameNumber(),
                "frame_number": self.ale.getFrameNumber()}

    def state_dict(self) -> dict[str, Any]:
        return {"last_action": self.last_action, "screens": self.screens.copy(), "frames": self.frames.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_action = None if state["last_action"] is None else int(state["last_action"])
        np.copyto(self.screens, state["screens"])
        np.copyto(self.frames, state["frames"])


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

    def _ale(self) -> Any:
        atari: Any = self.env.unwrapped  # ale_py's AtariEnv (gymnasium's types do not know its ale)
        return atari.ale

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self._ale().lives()
        self.game_over = bool(terminated or truncated)
        life_lost = 0 < lives < self.lives
        self.lives, self.last_observation = lives, obs
        info["traj_done"] = self.game_over
        return obs, float(reward), bool(terminated or life_lost), truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self.game_over or seed is not None or self.last_observation is None:
            obs, info = self.env.reset(seed=seed, options=options)
            self.lives, self.game_over = self._ale().lives(), False
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

    Every layer can be checkpointed (:mod:`tdrl.envs.state`): frame skip, sticky actions (per frame, as ALE's own,
    whose previous action ``cloneState`` leaves out), no-op starts and the frame stack are :class:`AtariFrames`,
    and the horizon is tdrl's :class:`~tdrl.envs.time_limit.TimeLimit` in agent steps.
    """
    options = {key: kwargs.pop(key, default) for key, default in _ATARI_DEFAULTS.items()}
    horizon, episodic_lives = options.pop("horizon"), options.pop("episodic_lives")
    sticky = kwargs.pop("repeat_action_probability", 0.25 if env_id.startswith("ALE/") else 0.0)
    kwargs.setdefault("obs_type", "grayscale")  # what ALE copies out at a reset: 1 byte a pixel, not 3
    # frame skipping and sticky actions are AtariFrames'; no limit inside ALE or gymnasium: the TimeLimit below
    # counts agent steps
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=0,
                   max_episode_steps=-1, **kwargs)
    env = AtariFrames(env, repeat_action_probability=sticky, **options)
    if horizon and horizon > 0:
        env = TimeLimit(env, horizon)
    return EpisodicLives(env) if episodic_lives else env


class MinAtarImage(gym.ObservationWrapper):
    """MinAtar's ``[10, 10, C]`` bool state as a ``[C, 10, 10]`` uint8 image (0 or 255), the layout and dtype tdrl's
    conv torsos and replay take for frames."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        if shape is None or len(shape) != 3:
            raise ValueError(f"MinAtarImage needs a [10, 10, C] observation, got {env.observation_space}")
        h, w, c = shape
        self.observation_space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0)).astype(np.uint8) * np.uint8(255)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Also seeds ``np_random`` as gymnasium's ``reset(seed=)`` does (MinAtar's seeds only its game): unseeded,
        it starts from OS entropy, and a resumed run's env state would differ from an uninterrupted one's."""
        if seed is not None:
            self.unwrapped.np_random, _ = gym.utils.seeding.np_random(seed)
        return super().reset(seed=seed, options=options)

    def state_dict(self) -> dict[str, Any]:
        return {}  # a pure function of the observation

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def make_minatar(env_id: str, **kwargs: Any) -> gym.Env:
    """A MinAtar game (``MinAtar/Breakout-v1``: minimal action set; ``-v0``: all 6 actions) as uint8 images;
    ``kwargs`` go to ``gymnasium.make`` (e.g. ``sticky_action_prob``, 0.1 by default). Needs ``pip install
    'tdrl[minatar]'``.

    Every layer can be checkpointed (:mod:`tdrl.envs.state`): the game, with its sticky actions' previous action
    and RNG, through the adapter of ``minatar.gym.BaseEnv``; :class:`MinAtarImage` keeps no state.
    """
    return MinAtarImage(gym.make(env_id, **kwargs))


def register_minatar() -> None:
    """Register the ``MinAtar/`` ids with gymnasium (the package registers them only when asked)."""
    from minatar.gym import register_envs

    if "MinAtar/Breakout-v1" not in gym.registry:
        register_envs()
