"""Evaluation: ``n_envs`` whole greedy episodes per call, on the evaluator's own envs.

Each :meth:`EvalCollector.evaluate` runs one wait-reset batch of ``max_steps`` steps on envs whose time limit is
``max_steps``, so every env plays exactly one whole episode (a step budget shared by all envs would favour short
episodes), under DETERMINISTIC exploration (an ``EpsilonGreedy`` uses its ``eps_eval``). The envs are seeded once
and continue their streams: successive evaluations see new initial states, and a run is reproducible. With
``video=True`` env 0 is built with ``render_mode="rgb_array"`` and its episode's frames are kept in ``video_frames``
(the trainer writes them to the run directory and W&B); the returns are the same with or without video.

A policy trained on observations that the training collector transformed (``transform=``, e.g. TorchRL's
``VecNorm`` or ``CatFrames``) is evaluated on observations transformed the same way, by default: the evaluator runs
a copy of that transform on its own envs, and before each evaluation loads the training collector's statistics
(those of transforms with ``freeze``, such as ``VecNorm``, from its first slice as they stand), frozen, so
evaluating never moves them. The training collector is ``observations_of=``, or the one the trainer is given
(:meth:`EvalCollector.follow`); ``follow_transform=False`` evaluates on raw observations.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import gymnasium as gym
import numpy as np
from tensordict.nn import InteractionType, TensorDictModuleBase
from torchrl.envs import Transform

from tdrl.collect.batched_env import BatchedEnvEngine
from tdrl.collect.collector import BatchCollector
from tdrl.collect.runner import SliceSettings
from tdrl.collect.serial import SerialEngine
from tdrl.envs import EnvFactory, EnvTraits
from tdrl.utils.errors import UserError

__all__ = ["EvalCollector", "make_eval_collector"]


class EvalCollector:
    """Runs whole greedy episodes with a wait-reset serial collector (built by ``build(transform)`` at the first
    evaluation); ``evaluate()`` returns their TrajInfos (also kept in ``traj_infos``). The policy is evaluated with
    its current weights: there are none to load. With a training collector to follow (``observations_of`` or
    :meth:`follow`) whose ``transform`` is set, the envs run a copy of it, with that collector's statistics loaded
    (frozen) before each evaluation."""

    def __init__(self, build: Callable[[Transform | None], BatchCollector], filmed: _FilmFirstEnv | None = None, *,
                 observations_of: BatchCollector | None = None, follow_transform: bool = True) -> None:
        self.build, self.filmed = build, filmed
        self.follow_transform = follow_transform
        self.observations_of: BatchCollector | None = None
        self.transform: Transform | None = None
        self._collector: BatchCollector | None = None
        self.traj_infos: list[dict[str, float]] = []
        self.video_frames: np.ndarray | None = None  # [T + 1, H, W, 3] of env 0's last episode, with video=True
        if observations_of is not None:
            self.follow(observations_of, explicit=True)

    def follow(self, collector: Any, *, explicit: bool = False) -> None:
        """Evaluate on observations transformed as ``collector``'s (a training collector with a ``transform``),
        unless built with ``follow_transform=False`` (``explicit``: asked for by name, which wins). Call before the
        first evaluation; the trainers call it with their collector."""
        transform = getattr(collector, "transform", None)
        if transform is None or not (self.follow_transform or explicit) or self.observations_of is not None:
            return
        if self._collector is not None:
            raise RuntimeError("follow() must come before the first evaluation: the eval envs are already built")
        self.observations_of, self.transform = collector, transform.clone()

    @property
    def collector(self) -> BatchCollector:
        """The serial wait-reset collector the episodes run in (built on first use)."""
        if self._collector is None:
            self._collector = self.build(self.transform)
        return self._collector

    def evaluate(self) -> list[dict[str, float]]:
        """One episode per env with the policy's current weights."""
        collector = self.collector  # building it runs the transform once: its statistics exist to load into
        if self.observations_of is not None and self.transform is not None:
            state = self.observations_of.transform_state()
            if state is not None:  # the collector's statistics, frozen; first observations transformed with them
                cast(SerialEngine, collector.engine).restart_transform(state)
        collector.collect()
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
        if self._collector is not None:
            self._collector.shutdown()

    def __enter__(self) -> EvalCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class _FrameRecorder(gym.Wrapper):
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
    """An env factory whose first env renders into a :class:`_FrameRecorder`: the evaluator's env 0, as a collector
    builds its envs in order (specs come from ``specs()``, without building one)."""

    def __init__(self, factory: EnvFactory) -> None:
        self.factory = factory
        self.recorder: _FrameRecorder | None = None

    def specs(self) -> Any:
        return self.factory.specs()

    @property
    def traits(self) -> EnvTraits:
        return self.factory.traits

    def __call__(self, seed: int | None = None) -> gym.Env:
        if self.recorder is not None:
            return self.factory(seed)
        os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders headless unless told otherwise
        rendering = EnvFactory(self.factory.env_id, {**self.factory.kwargs, "render_mode": "rgb_array"})
        self.recorder = _FrameRecorder(rendering(seed))
        return self.recorder


def make_eval_collector(env_id: str, policy: TensorDictModuleBase | None, *, n_envs: int, max_steps: int = 0, seed: int,
        discount: float = 0.99, env_kwargs: dict | None = None, video: bool = False,
        observations_of: BatchCollector | None = None, follow_transform: bool = True) -> EvalCollector | None:
    """The evaluator every recipe uses, or ``None`` when ``n_envs == 0`` (no evaluation).

    Args:
        env_id: env id (built with :class:`tdrl.envs.EnvFactory`); a batched family's (``vmas/...``) runs as one
            env object of ``n_envs`` envs (:mod:`tdrl.collect.batched_env`).
        policy: the policy evaluated (its current weights at each call; ``None``: random actions).
        n_envs: episodes per evaluation, one per env.
        max_steps: episode time limit; 0 takes the env's own (1000 when it has none).
        seed: seed of the eval envs (use another than the training collector's).
        discount: discount of the TrajInfo ``DiscountedReturn``.
        env_kwargs: extra ``gymnasium.make`` arguments; not Atari's ``episodic_lives``: an evaluation plays whole
            games (rlpyt's eval envs), and one episode per env would stop at the first lost life.
        video: keep the frames of env 0's episode in ``video_frames`` after each evaluation.
        observations_of: the training collector whose ``transform`` the policy's observations went through: the
            evaluation's go through it too, with that collector's statistics at each evaluation, frozen. Without
            it, the trainer this evaluator is given to passes its collector (:meth:`EvalCollector.follow`).
        follow_transform: ``False``: evaluate on raw observations even where the training collector transforms
            them (the trainer then does not pass its collector).

    Raises:
        ValueError: ``env_kwargs`` asks for ``episodic_lives``.
        UserError: ``video`` for a batched env.
    """
    if n_envs == 0:
        return None
    kwargs = dict(env_kwargs or {})
    if kwargs.get("episodic_lives"):
        raise ValueError("evaluation plays whole games: build the eval envs without episodic_lives (training "
                         "TrajInfos span the game anyway)")
    limit = max_steps or EnvFactory(env_id, kwargs).specs().max_episode_steps or 1000
    factory = EnvFactory(env_id, {**kwargs, "max_episode_steps": limit})
    batched = factory.traits.batched  # one env object of n_envs envs (VMAS)
    if video and batched:
        raise UserError(f"eval.video=true films one gymnasium env; '{env_id}' is a batched torch env, not filmed yet")
    filmed = _FilmFirstEnv(factory) if video else None

    def build(transform: Transform | None) -> BatchCollector:
        # wait-reset with a transform: built here, as make_collector allows transforms with reset-at-once only
        # (idle envs' repeated steps would move training statistics; these are frozen). Through the env protocol,
        # so the raw observations stay, to be transformed again with each evaluation's statistics.
        settings = SliceSettings(filmed or factory, seed, True, 0, discount, transform, env_protocol=True)
        greedy = InteractionType.DETERMINISTIC
        engine: Any = (BatchedEnvEngine if batched else SerialEngine)(settings, policy, batch_B=n_envs,
                                                                       batch_T=limit, exploration=greedy)
        return BatchCollector(engine, exploration_type=greedy, return_same_td=True, transform=transform)

    return EvalCollector(build, filmed, observations_of=observations_of, follow_transform=follow_transform)
