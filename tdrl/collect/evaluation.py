"""Evaluation: ``n_envs`` whole greedy episodes per call, on the evaluator's own envs.

Each :meth:`EvalCollector.evaluate` runs one wait-reset batch of ``max_steps`` steps on envs whose time limit is
``max_steps``, so every env plays exactly one whole episode (a step budget shared by all envs would favour short
episodes), under DETERMINISTIC exploration (an ``EpsilonGreedy`` uses its ``eps_eval``). The envs are seeded once
and continue their streams: successive evaluations see new initial states, and a run is reproducible. With
``video=True`` env 0 is built with ``render_mode="rgb_array"`` and its episode's frames are kept in ``video_frames``
(the trainer writes them to the run directory and W&B); the returns are the same with or without video.

A policy trained on observations that the training collector transformed (``transform=``, e.g. TorchRL's
``VecNorm``) is evaluated on observations transformed the same way: ``observations_of=collector`` passes each
observation through a copy of that transform holding the collector's first-slice state as it stands at each
evaluation, frozen (``frozen_copy`` where the transform has one), so evaluating never moves the statistics.
"""

from __future__ import annotations

import copy
import os
from typing import Any, cast

import gymnasium as gym
import numpy as np
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import Transform

from tdrl.collect.collector import BatchCollector
from tdrl.collect.factory import make_collector
from tdrl.envs import EnvFactory
from tdrl.utils.keys import OBS_KEY

__all__ = ["EvalCollector", "FrameRecorder", "TransformedObservations", "make_eval_collector"]


class TransformedObservations(TensorDictModuleBase):
    """``policy`` acting on ``observation`` passed through ``transform`` (the input TensorDict keeps the raw one);
    :meth:`follow` loads the training collector's current transform state, frozen."""

    def __init__(self, policy: TensorDictModuleBase, transform: Transform) -> None:
        super().__init__()
        self.policy, self.template, self.transform = policy, copy.deepcopy(transform), copy.deepcopy(transform)
        self.in_keys, self.out_keys = list(policy.in_keys), list(policy.out_keys)

    def follow(self, state: dict[str, Any]) -> None:
        self.template.load_state_dict(state)
        frozen_copy = getattr(self.template, "frozen_copy", None)  # VecNorm's: its statistics stop updating
        self.transform = frozen_copy() if callable(frozen_copy) else copy.deepcopy(self.template)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs = td.get(OBS_KEY)
        step = TensorDict({OBS_KEY: obs, "reward": obs.new_zeros(obs.shape[0], 1)}, obs.shape[:1])  # as a step's
        seen = td.clone(recurse=False).set(OBS_KEY, self.transform(step)[OBS_KEY])
        return td.update(self.policy(seen).select(*self.policy.out_keys, strict=False))


class EvalCollector:
    """Runs whole greedy episodes with a wait-reset serial ``collector``; ``evaluate()`` returns their TrajInfos
    (also kept in ``traj_infos``). The policy is evaluated with its current weights: there are none to load; with
    ``observations_of`` (a training collector) and ``transformed`` (the evaluated policy's wrapper), each evaluation
    first loads that collector's transform state."""

    def __init__(self, collector: BatchCollector, filmed: _FilmFirstEnv | None = None, *,
                 observations_of: BatchCollector | None = None,
                 transformed: TransformedObservations | None = None) -> None:
        self.collector = collector
        self.filmed = filmed
        self.observations_of, self.transformed = observations_of, transformed
        self.traj_infos: list[dict[str, float]] = []
        self.video_frames: np.ndarray | None = None  # [T + 1, H, W, 3] of env 0's last episode, with video=True

    def evaluate(self) -> list[dict[str, float]]:
        """One episode per env with the policy's current weights."""
        if self.observations_of is not None and self.transformed is not None:
            state = self.observations_of.transform_state()
            if state is not None:
                self.transformed.follow(state)
        self.collector.collect()
        self.traj_infos = self.collector.traj_infos
        if self.filmed is not None and self.filmed.recorder is not None and self.filmed.recorder.last_episode:
            self.video_frames = np.stack(self.filmed.recorder.last_episode)
        return self.traj_infos

    def state_dict(self) -> dict[str, Any]:
        """Where the eval envs' streams stand (their state between evaluations), so a resumed run evaluates the
        same episodes."""
        return self.collector.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.collector.load_state_dict(state)

    def shutdown(self) -> None:
        self.collector.shutdown()

    def __enter__(self) -> EvalCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class FrameRecorder(gym.Wrapper):
    """Renders the reset frame and every step's frame; ``last_episode`` holds the frames of the last episode that a
    reset ended (the evaluator resets finished envs at the end of each evaluation)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.frames: list[np.ndarray] = []
        self.last_episode: list[np.ndarray] = []

    def reset(self, **kwargs: Any) -> Any:
        out = self.env.reset(**kwargs)
        if len(self.frames) > 1:
            self.last_episode = self.frames
        self.frames = [cast(np.ndarray, self.env.render())]  # render_mode="rgb_array": one frame
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        self.frames.append(cast(np.ndarray, self.env.render()))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Nothing to resume: frames are output, and each evaluation films a whole new episode."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _FilmFirstEnv:
    """An env factory whose first env renders into a :class:`FrameRecorder`: the evaluator's env 0, as a collector
    builds its envs in order (specs come from ``specs()``, without building one)."""

    def __init__(self, factory: EnvFactory) -> None:
        self.factory = factory
        self.recorder: FrameRecorder | None = None

    def specs(self) -> Any:
        return self.factory.specs()

    @property
    def is_atari(self) -> bool:
        return self.factory.is_atari

    def __call__(self, seed: int | None = None) -> gym.Env:
        if self.recorder is not None:
            return self.factory(seed)
        os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders headless unless told otherwise
        rendering = EnvFactory(self.factory.env_id, {**self.factory.kwargs, "render_mode": "rgb_array"})
        self.recorder = FrameRecorder(rendering(seed))
        return self.recorder


def make_eval_collector(env_id: str, policy: TensorDictModuleBase | None, *, n_envs: int, max_steps: int = 0, seed: int,
        discount: float = 0.99, env_kwargs: dict | None = None, video: bool = False,
        observations_of: BatchCollector | None = None) -> EvalCollector | None:
    """The evaluator every recipe uses, or ``None`` when ``n_envs == 0`` (no evaluation).

    Args:
        env_id: gymnasium id (built with :class:`tdrl.envs.EnvFactory`).
        policy: the policy evaluated (its current weights at each call; ``None``: random actions).
        n_envs: episodes per evaluation, one per env.
        max_steps: episode time limit; 0 takes the env's own (1000 when it has none).
        seed: seed of the eval envs (use another than the training collector's).
        discount: discount of the TrajInfo ``DiscountedReturn``.
        env_kwargs: extra ``gymnasium.make`` arguments; not Atari's ``episodic_lives``: an evaluation plays whole
            games (rlpyt's eval envs), and one episode per env would stop at the first lost life.
        video: keep the frames of env 0's episode in ``video_frames`` after each evaluation.
        observations_of: the training collector whose ``transform`` the policy's observations went through: the
            evaluation's go through it too, with that collector's state at each evaluation, frozen.

    Raises:
        ValueError: ``env_kwargs`` asks for ``episodic_lives``.
    """
    if n_envs == 0:
        return None
    kwargs = dict(env_kwargs or {})
    if kwargs.get("episodic_lives"):
        raise ValueError("evaluation plays whole games: build the eval envs without episodic_lives (training "
                         "TrajInfos span the game anyway)")
    limit = max_steps or EnvFactory(env_id, kwargs).specs().max_episode_steps or 1000
    factory = EnvFactory(env_id, {**kwargs, "max_episode_steps": limit})
    filmed = _FilmFirstEnv(factory) if video else None
    transformed = None
    if observations_of is not None and observations_of.transform is not None and policy is not None:
        policy = transformed = TransformedObservations(policy, observations_of.transform)
        state = observations_of.transform_state()
        if state is not None:  # the state at build, so the collector's first call sees statistics
            transformed.follow(state)
    collector = make_collector("serial", filmed or factory, policy, batch_B=n_envs, batch_T=limit, seed=seed,
                               reset_mode="wait_reset", exploration_type="deterministic", discount=discount,
                               return_same_td=True)
    return EvalCollector(collector, filmed, observations_of=observations_of if transformed else None,
                         transformed=transformed)
