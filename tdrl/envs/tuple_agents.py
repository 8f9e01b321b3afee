"""A gymnasium env with ``Tuple`` spaces over its agents (lbforaging) as a PettingZoo-style parallel env.

This module imports only gymnasium and numpy, never tdrl: ``benchmarks/benchmarl_lbf.py`` loads it by path in
BenchMARL's venv (which cannot hold tdrl), so both sides of the LBF comparison step lbforaging through this one
adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["TupleAgents"]


class TupleAgents:
    """A gymnasium env whose spaces are ``Tuple``s over agents and whose reward is a list (lbforaging) as a
    PettingZoo-style parallel env with agents ``agent_0 ... agent_{n-1}``; the episode ends for all at once.

    Its global ``state`` is the agents' observations concatenated (EPyMARL's for lbforaging, and what BenchMARL's
    QMIX mixes on without one), so QMIX runs on it; there is none when an observation space is not a ``Box``."""

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        if not isinstance(env.observation_space, gym.spaces.Tuple) or not isinstance(env.action_space,
                                                                                       gym.spaces.Tuple):
            raise ValueError(f"{env} does not have Tuple spaces over its agents")
        self.obs_spaces, self.action_spaces = env.observation_space.spaces, env.action_space.spaces
        self.possible_agents = [f"agent_{i}" for i in range(len(self.obs_spaces))]
        self.agents: list[str] = []
        self._last_obs: tuple[Any, ...] = ()
        boxes = [space for space in self.obs_spaces if isinstance(space, gym.spaces.Box)]
        if len(boxes) == len(self.obs_spaces):
            self.state_space = gym.spaces.Box(np.concatenate([b.low.ravel() for b in boxes]),
                                              np.concatenate([b.high.ravel() for b in boxes]), dtype=np.float32)

    def state(self) -> np.ndarray:
        return np.concatenate([np.ravel(obs) for obs in self._last_obs]).astype(np.float32)

    def observation_space(self, agent: str) -> gym.Space:
        return self.obs_spaces[self.possible_agents.index(agent)]

    def action_space(self, agent: str) -> gym.Space:
        return self.action_spaces[self.possible_agents.index(agent)]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        obs, _ = self.env.reset(seed=seed, options=options)
        self._last_obs = tuple(obs)
        self.agents = list(self.possible_agents)
        return dict(zip(self.agents, obs, strict=True)), {agent: {} for agent in self.agents}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        agents = self.possible_agents
        obs, rewards, terminated, truncated, _ = self.env.step(tuple(actions[a] for a in agents))
        self._last_obs = tuple(obs)
        if terminated or truncated:
            self.agents = []
        rewards_: Any = rewards  # a list, one per agent, where gymnasium types a float
        return (dict(zip(agents, obs, strict=True)), {a: float(r) for a, r in zip(agents, rewards_, strict=True)},
                {a: bool(terminated) for a in agents}, {a: bool(truncated) for a in agents}, {a: {} for a in agents})

    def close(self) -> None:
        self.env.close()
