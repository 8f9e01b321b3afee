"""Partially observed classic control: CartPole without its velocities, the quick check of a recurrent agent.

``tdrl/CartPoleNoVelocity-v1`` is ``CartPole-v1`` (500-step limit) observing only the cart position and the pole
angle: a memoryless policy cannot tell which way the pole moves, a recurrent one infers it (the masked-velocity
POMDP of RL-Zoo and Ni et al. 2022).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["register_pomdps"]


class _MaskObservation(gym.ObservationWrapper):
    """Keep only the observation entries ``keep`` (indices of a flat Box observation)."""

    def __init__(self, env: gym.Env, keep: list[int]) -> None:
        super().__init__(env)
        self.keep = np.asarray(keep)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"observation masking needs a Box observation space, got {space}")
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep], dtype=space.dtype.type)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]

    def state_dict(self) -> dict[str, Any]:
        return {}  # a pure function of the observation: the env below holds the state (exact resume)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """CartPole observing ``[x, theta]`` (entries 0 and 2; velocities 1 and 3 are masked)."""
    from gymnasium.envs.classic_control import CartPoleEnv

    return _MaskObservation(CartPoleEnv(**kwargs), [0, 2])


def register_pomdps() -> None:
    """Register the ``tdrl/`` ids with gymnasium (once)."""
    if "tdrl/CartPoleNoVelocity-v1" not in gym.registry:
        gym.register("tdrl/CartPoleNoVelocity-v1", entry_point=cartpole_no_velocity, max_episode_steps=500,
                     reward_threshold=475.0)
