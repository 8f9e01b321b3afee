"""tdrl/CartPoleNoVelocity-v1: CartPole observing position and angle only, same dynamics and time limit."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from tdrl.envs import EnvFactory, make_env


def test_cartpole_without_velocities_masks_them():
    masked, full = make_env("tdrl/CartPoleNoVelocity-v1", seed=3), gym.make("CartPole-v1")
    obs, _ = masked.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])
    for _ in range(20):
        obs, reward, terminated, truncated, _ = masked.step(1)
        full_obs, full_reward, *_ = full.step(1)
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])
        assert reward == full_reward
    specs = EnvFactory("tdrl/CartPoleNoVelocity-v1").specs()
    assert tuple(specs.observation_spec.shape) == (2,) and specs.max_episode_steps == 500
