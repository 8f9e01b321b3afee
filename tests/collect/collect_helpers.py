"""Tiny deterministic envs and policies for the collector tests (importable by spawned workers)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import TensorDictModule

from tdrl.envs import EnvTraits
from tdrl.envs.make import EnvSpecs

GAME_TRAITS = EnvTraits(game_score=True, episodic_lives=True)  # Atari's, as collectors read them


class StairsEnv(gym.Env):
    """Episode of ``length`` steps; step ``k`` (1-based) pays ``k`` unless ``k % 3 == 0`` (pays 0).

    Observation ``[k, action_sum]``; ``terminated`` at ``length`` (or ``truncated`` when ``truncate``). Known
    returns make TrajInfo checks exact.
    """

    metadata: dict = {}

    def __init__(self, length: int = 5, truncate: bool = False, fail_at: int | None = None) -> None:
        self.length = length
        self.truncate = truncate
        self.fail_at = fail_at
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.k = 0
        self.total_steps = 0
        self.action_sum = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        self.action_sum = 0.0
        return np.array([0.0, 0.0], np.float32), {}

    def step(self, action):
        self.k += 1
        self.total_steps += 1
        if self.fail_at is not None and self.total_steps >= self.fail_at:
            raise ValueError(f"StairsEnv exploded at step {self.total_steps}")
        self.action_sum += float(action)
        reward = 0.0 if self.k % 3 == 0 else float(self.k)
        end = self.k >= self.length
        obs = np.array([self.k, self.action_sum], np.float32)
        return obs, reward, end and not self.truncate, end and self.truncate, {}


def stairs_return(length: int, discount: float) -> tuple[float, float, int]:
    rewards = [0.0 if k % 3 == 0 else float(k) for k in range(1, length + 1)]
    disc = sum(r * discount**i for i, r in enumerate(rewards))
    return sum(rewards), disc, sum(r != 0 for r in rewards)


@dataclass(frozen=True)
class StairsFactory:
    """Picklable factory for :class:`StairsEnv`."""

    length: int = 5
    truncate: bool = False
    fail_at: int | None = None

    def __call__(self, seed: int | None = None) -> gym.Env:
        return StairsEnv(self.length, self.truncate, self.fail_at)

    def specs(self) -> EnvSpecs:
        return EnvSpecs.from_env(self())


class SlowEnvFactory(StairsFactory):
    pass


@dataclass(frozen=True)
class SuicideFactory:
    """Env whose worker process SIGKILLs itself at step ``at`` (a worker dying without a Python error)."""

    at: int = 20

    def __call__(self, seed: int | None = None) -> gym.Env:
        env = StairsEnv(length=1000)
        at = self.at
        step = env.step

        def dying_step(action):
            if env.total_steps + 1 >= at:
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(10)
            return step(action)

        env.step = dying_step
        return env

    def specs(self) -> EnvSpecs:
        return EnvSpecs.from_env(StairsEnv())


class PolicyMLP(torch.nn.Module):
    """2×64 tanh MLP; argmax (discrete) or tanh (continuous) head — a deterministic policy."""

    def __init__(self, n_in: int, n_out: int, discrete: bool) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_in, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
            torch.nn.Linear(64, n_out),
        )
        self.discrete = discrete

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.net(obs)
        return out.argmax(-1) if self.discrete else torch.tanh(out)


def mlp_policy(n_in: int, n_out: int, discrete: bool, seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(PolicyMLP(n_in, n_out, discrete), ["observation"], ["action"])


class ConstantAction(torch.nn.Module):
    """Always action ``value`` (a parameter, so weight updates are observable)."""

    def __init__(self, value: int = 0) -> None:
        super().__init__()
        self.value = torch.nn.Parameter(torch.tensor(float(value)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value.detach().round().long().expand(obs.shape[0]).clone()


class StepCounter(torch.nn.Module):
    """Recurrent toy: state ``h`` counts steps since the episode began (zero when the state is missing)."""

    def forward(self, obs: torch.Tensor, h: torch.Tensor | None):
        if h is None:
            h = torch.zeros(obs.shape[0], 1)
        return torch.zeros(obs.shape[0], dtype=torch.long), h + 1


def counter_policy() -> TensorDictModule:
    return TensorDictModule(
        StepCounter(),
        in_keys=["observation", ("recurrent_state", "h")],
        out_keys=["action", ("next", "recurrent_state", "h")],
    )


class EnvIndexAction(torch.nn.Module):
    """Action = global env index mod 2; also writes the index it saw."""

    def forward(self, obs: torch.Tensor, env_index: torch.Tensor):
        return env_index % 2, env_index.clone()


def env_index_policy() -> TensorDictModule:
    return TensorDictModule(EnvIndexAction(), in_keys=["observation", ("collector", "env_index")],
                            out_keys=["action", "seen_env_index"])


@dataclass(frozen=True)
class AtariLikeFactory(StairsFactory):
    """StairsEnv with Atari's traits, so TrajInfos carry GameScore."""

    traits: EnvTraits = GAME_TRAITS


class LivesEnv(gym.Env):
    """A game of ``lives`` lives of ``life_length`` steps, as Atari with episodic lives looks to a collector: a lost
    life is ``terminated`` with ``info["traj_done"]`` False and ``reset()`` after it continues the game; the last
    life ends the game (``traj_done`` True). Step ``k`` of a game (1-based) pays ``k``; observation ``[k, lives]``.
    Checkpoints itself (``state_dict``) for exact resume."""

    metadata: dict = {}

    def __init__(self, lives: int = 3, life_length: int = 4) -> None:
        self.lives, self.life_length = lives, life_length
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.k = 0
        self.game_over = True

    def _obs(self) -> np.ndarray:
        return np.array([self.k, self.lives - self.k // self.life_length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.game_over or seed is not None:
            self.k, self.game_over = 0, False
        return self._obs(), {}

    def step(self, action):
        self.k += 1
        self.game_over = self.k >= self.lives * self.life_length
        life_lost = self.k % self.life_length == 0
        return self._obs(), float(self.k), life_lost, False, {"traj_done": self.game_over}

    def state_dict(self) -> dict:
        return {"k": self.k, "game_over": self.game_over}

    def load_state_dict(self, state: dict) -> None:
        self.k, self.game_over = int(state["k"]), bool(state["game_over"])


@dataclass(frozen=True)
class LivesFactory:
    """Picklable factory for :class:`LivesEnv`, with Atari's traits (TrajInfos carry GameScore)."""

    lives: int = 3
    life_length: int = 4
    traits: EnvTraits = GAME_TRAITS

    def __call__(self, seed: int | None = None) -> gym.Env:
        return LivesEnv(self.lives, self.life_length)

    def specs(self) -> EnvSpecs:
        return EnvSpecs.from_env(self())
