"""Action masks for single-agent envs, as TorchRL reads them: an ``action_mask`` entry beside the observation.

Gymnasium has two conventions. An env whose observation space is a ``Dict`` with an ``action_mask`` entry
(PettingZoo's classic games, many custom envs) needs nothing: tdrl's collectors store every entry of a dict
observation (``observation``, ``action_mask``, ...; :mod:`tdrl.collect.stepping`), and bool is what TorchRL's
``MaskedCategorical`` and ``ActionMask`` read. An env that puts the mask in ``info`` (gymnasium's ``Taxi-v4``) is
wrapped in :class:`InfoActionMask`, which moves it into such a dict observation.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["InfoActionMask"]


class InfoActionMask(gym.Wrapper):
    """Observations become ``{"observation": obs, "action_mask": info["action_mask"]}`` (bool, one flag per
    discrete action; all True on a step whose info has none). Keeps no state (:mod:`tdrl.envs.state`)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise TypeError(f"InfoActionMask needs a Discrete action space, got {env.action_space}")
        self.n_actions = int(env.action_space.n)
        self.observation_space = gym.spaces.Dict({"observation": env.observation_space,
                                                  "action_mask": gym.spaces.MultiBinary(self.n_actions)})

    def _observe(self, obs: Any, info: dict[str, Any]) -> dict[str, Any]:
        mask = info.get("action_mask")
        return {"observation": obs,
                "action_mask": np.ones(self.n_actions, bool) if mask is None else np.asarray(mask, bool)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._observe(obs, info), info

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(obs, info), reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
