"""tdrl's time limit: gymnasium's ``TimeLimit`` semantics with a public, checkpointable step counter."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

__all__ = ["TimeLimit"]


class TimeLimit(gym.Wrapper):
    """Truncates an episode after ``max_episode_steps`` steps, as gymnasium's ``TimeLimit`` does, with a public,
    checkpointable step counter (gymnasium's is a private attribute, so a resumed episode could not keep it)."""

    def __init__(self, env: gym.Env, max_episode_steps: int):
        if max_episode_steps <= 0:
            raise ValueError(f"max_episode_steps must be positive, got {max_episode_steps}")
        super().__init__(env)
        self.max_episode_steps = max_episode_steps
        self.elapsed_steps = 0

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.elapsed_steps += 1
        if self.elapsed_steps >= self.max_episode_steps:
            truncated = True
        return observation, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.elapsed_steps = 0
        return self.env.reset(seed=seed, options=options)

    # gymnasium.Env declares spec as a plain attribute, which its own Wrapper overrides with a property too
    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:  # type: ignore[override]
        """The wrapped env's spec with this limit, as gymnasium reports it."""
        spec = self.env.spec
        return None if spec is None else dataclasses.replace(spec, max_episode_steps=self.max_episode_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_steps": self.elapsed_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.elapsed_steps = int(state["elapsed_steps"])
