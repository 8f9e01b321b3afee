"""Envs and policies for the dict-observation and multi-agent collector tests (importable by worker processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import TensorDictModule

from tdrl.envs import EnvFactory
from tdrl.envs.action_mask import InfoActionMask
from tdrl.envs.make import EnvSpecs
from tdrl.envs.multiagent import GroupedEnv


class MaskedWalkEnv(gym.Env):
    """A single-agent walk on a line with a dict observation: ``observation`` (position, step), a nested
    ``goal`` entry, and ``action_mask`` (left is masked at the left wall). Actions 0 left, 1 stay, 2 right; reward
    ``-|goal - position|``; the episode ends at the goal (terminated) or after 7 steps (truncated)."""

    metadata: dict = {}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({
            "observation": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "goal": gym.spaces.Dict({"xy": gym.spaces.Box(-10, 10, (2,), np.float32)}),
            "action_mask": gym.spaces.MultiBinary(3),
        })
        self.action_space = gym.spaces.Discrete(3)
        self.pos, self.goal, self.k = 0, 0, 0

    def _obs(self) -> dict[str, Any]:
        return {"observation": np.array([self.pos, self.k], np.float32),
                "goal": {"xy": np.array([self.goal, -self.goal], np.float32)},
                "action_mask": np.array([self.pos > 0, True, True], np.int8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.k = 0, 0
        self.goal = int(self.np_random.integers(2, 5))
        return self._obs(), {}

    def step(self, action):
        assert action != 0 or self.pos > 0, "a masked action reached the env"
        self.pos += int(action) - 1
        self.k += 1
        reward = -abs(self.goal - self.pos)
        terminated = self.pos == self.goal
        return self._obs(), float(reward), terminated, self.k >= 7 and not terminated, {}

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos, "goal": self.goal, "k": self.k, "rng": self.np_random.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.goal, self.k = state["pos"], state["goal"], state["k"]
        self.np_random.bit_generator.state = state["rng"]


@dataclass(frozen=True)
class MaskedWalkFactory:
    def __call__(self, seed: int | None = None) -> gym.Env:
        env = MaskedWalkEnv()
        if seed is not None:
            env.reset(seed=seed)
        return env

    def specs(self) -> EnvSpecs:
        return EnvSpecs.from_env(MaskedWalkEnv())


@dataclass(frozen=True)
class TaxiFactory(EnvFactory):
    """Taxi-v4 (its action mask in ``info``) with the mask moved into the observation."""

    env_id: str = "Taxi-v4"

    def __call__(self, seed: int | None = None) -> gym.Env:
        return InfoActionMask(super().__call__(seed))


class MaskedArgmax(torch.nn.Module):
    """Deterministic: the allowed action with the largest ``Linear(obs ++ goal)`` logit."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(4, 3)

    def forward(self, obs: torch.Tensor, goal: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.net(torch.cat([obs, goal], -1))
        return logits.masked_fill(~mask, -torch.inf).argmax(-1)


def masked_walk_policy() -> TensorDictModule:
    return TensorDictModule(MaskedArgmax(), in_keys=["observation", ("goal", "xy"), "action_mask"],
                            out_keys=["action"])


class LeavingEnv:
    """A PettingZoo-style parallel env: agents ``walker_0`` and ``walker_1``, and ``scout_0``. ``walker_1`` leaves
    (terminated) after step 2, ``scout_0`` is truncated after step 3 and ``walker_0`` terminates after step 4, which
    ends the episode. Observations ``[step, agent index]``; rewards ``10 * agent index + step``; ``state()`` is
    the step."""

    def __init__(self) -> None:
        self.possible_agents = ["walker_0", "walker_1", "scout_0"]
        self.agents: list[str] = []
        self.state_space = gym.spaces.Box(0, 100, (1,), np.float32)
        self.k = 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(0, 100, (2,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {a: np.array([self.k, self.possible_agents.index(a)], np.float32) for a in agents}

    def state(self) -> np.ndarray:
        return np.array([self.k], np.float32)

    def reset(self, seed=None, options=None):
        self.k = 0
        self.agents = list(self.possible_agents)
        return self._obs(self.agents), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.k += 1
        acting = list(self.agents)
        rewards = {a: float(10 * self.possible_agents.index(a) + self.k) for a in acting}
        terminated = {a: (a == "walker_1" and self.k == 2) or (a == "walker_0" and self.k == 4) for a in acting}
        truncated = {a: a == "scout_0" and self.k == 3 for a in acting}
        obs = self._obs(acting)
        self.agents = [a for a in acting if not (terminated[a] or truncated[a])]
        return obs, rewards, terminated, truncated, {a: {} for a in acting}


@dataclass(frozen=True)
class LeavingFactory:
    group_map: Any = None

    def __call__(self, seed: int | None = None) -> GroupedEnv:
        env = GroupedEnv(LeavingEnv(), group_map=self.group_map)
        if seed is not None:
            env.reset(seed=seed)
        return env

    def specs(self) -> EnvSpecs:
        return EnvSpecs.from_env(self())


class GroupArgmax(torch.nn.Module):
    """Deterministic per-agent actions: ``argmax(Linear(observation))`` over each agent's row."""

    def __init__(self, n_obs: int, n_actions: int, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(n_obs, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


def group_policy(group: str, n_obs: int, n_actions: int) -> TensorDictModule:
    return TensorDictModule(GroupArgmax(n_obs, n_actions), in_keys=[(group, "observation")],
                            out_keys=[(group, "action")])
