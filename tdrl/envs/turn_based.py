"""Turn-based PettingZoo envs (the AEC API: ``tictactoe_v3``, ``connect_four_v3``, ``go_v5``) as the parallel-style
env :class:`~tdrl.envs.multiagent.GroupedEnv` steps, with TorchRL's ``PettingZooEnv`` semantics for AEC envs.

- One step is one AEC turn: the agent whose turn it is (``agent_selection``) is the one :attr:`acting`; its action
  is the one stepped, the other agents' actions are not passed on. ``GroupedEnv`` marks it in ``(group, "mask")``
  (True for that agent only) and gives the others an all-ones ``action_mask``; every agent's observation is there
  each step, as ``observe(agent)`` gives it.
- Rewards: each step returns every agent's entry of the env's ``rewards`` after that turn (PettingZoo: the rewards
  that turn produced), so an agent's reward for its move may come on the opponent's turn (a loss in tictactoe), in
  a row where it is masked; the sum of an agent's rewards over the episode is what PettingZoo's ``last()`` hands it
  over the game, nothing lost or counted twice.
- Done: an agent is done when the env terminates or truncates it; one done while others play on is stepped with
  ``None`` (PettingZoo's dead step) when its turn comes, outside tdrl's steps. The episode ends when every agent is
  done (TorchRL's ``all()`` for AEC envs).
- An action the acting agent's ``action_mask`` forbids raises :class:`IllegalActionError` rather than reach the env
  (PettingZoo's wrappers would end the game with the mover losing): a policy must sample through the mask.
- ``flatten`` (the default) gives each agent's observation flat (tictactoe's ``[3, 3, 2]`` board as ``[18]``), the
  input of the recipes' MLPs; ``flatten=False`` keeps the board for a convolutional network.

Resume: the env's layers are plain Python and numpy objects, which ``GroupedEnv.state_dict`` captures whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["IllegalActionError", "TurnBasedAgents"]


class IllegalActionError(ValueError):
    """The acting agent's action is one its ``action_mask`` forbids."""


class TurnBasedAgents:
    """A PettingZoo ``AECEnv`` as a parallel-style env whose :attr:`acting` agent is the one whose turn it is
    (module docstring). :attr:`agents` are the agents not yet done."""

    def __init__(self, env: Any, flatten: bool = True) -> None:
        self.env = env
        self.flatten = bool(flatten)
        self.possible_agents = list(env.possible_agents)
        self.agents: list[str] = []
        self.acting: list[str] = []
        self.legal: np.ndarray | None = None  # the acting agent's action mask, when the env has one
        self.obs_spaces = {a: self._flat_space(env.observation_space(a)) for a in self.possible_agents}
        if hasattr(env, "state_space"):  # a global state: GroupedEnv reads state() and state_space
            self.state_space = env.state_space

    def _flat_space(self, space: gym.Space) -> gym.Space:
        if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces:
            return gym.spaces.Dict({**space.spaces, "observation": self._flat_space(space["observation"])})
        if self.flatten and isinstance(space, gym.spaces.Box) and len(space.shape) != 1:
            return gym.spaces.Box(space.low.reshape(-1), space.high.reshape(-1), dtype=space.dtype)
        return space

    def observation_space(self, agent: str) -> gym.Space:
        return self.obs_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    def state(self) -> np.ndarray:
        return self.env.state()

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        self.env.reset(seed=seed, options=options)
        self._skip_dead()
        return self._observe(self.env.agents), self._infos()

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """One turn of the acting agent with ``actions[agent]``; every agent's observation, reward, flags and info
        after it."""
        if not self.acting:
            raise RuntimeError("the turn-based env was stepped after its episode ended; reset it")
        agent = self.acting[0]
        action = actions[agent]
        if self.legal is not None and not self.legal[int(action)]:
            raise IllegalActionError(f"{agent} chose action {int(action)}, which its action_mask forbids (legal: "
                                     f"{np.flatnonzero(self.legal).tolist()}); sample through (group, 'action_mask')")
        env, playing = self.env, self.agents
        env.step(action)
        rewards = {a: float(r) for a, r in env.rewards.items()}  # read before a dead step clears them
        terminations = {a: bool(t) for a, t in env.terminations.items()}
        truncations = {a: bool(t) for a, t in env.truncations.items()}
        infos = self._infos()
        # the agents done by this turn: their final observations, before dead steps remove them
        obs = self._observe([a for a in playing if a in env.agents and (terminations[a] or truncations[a])])
        self._skip_dead()
        obs.update(self._observe(self.agents))  # the others', once the turn has moved on
        return obs, rewards, terminations, truncations, infos

    def _skip_dead(self) -> None:
        """Step ``None`` for each done agent whose turn comes while others play on (PettingZoo's dead steps), then
        set :attr:`agents` and :attr:`acting`."""
        env = self.env
        while True:
            alive = [a for a in env.agents if not (env.terminations[a] or env.truncations[a])]
            if not alive or env.agent_selection in alive:
                break
            env.step(None)
        self.agents = alive
        self.acting = [env.agent_selection] if alive else []
        self.legal = None

    def _observe(self, agents: list[str]) -> dict[str, Any]:
        """``observe(agent)`` of ``agents``, flattened; keeps the acting agent's action mask."""
        out = {}
        for agent in agents:
            value = self.env.observe(agent)
            if isinstance(value, Mapping):
                value = {**value, "observation": self._flat(value["observation"])}
            else:
                value = self._flat(value)
            out[agent] = value
            if agent in self.acting:
                mask = value.get("action_mask") if isinstance(value, Mapping) else None
                if mask is None:
                    mask = (self.env.infos.get(agent) or {}).get("action_mask")
                self.legal = None if mask is None else np.asarray(mask, bool)
        return out

    def _flat(self, value: Any) -> Any:
        return np.asarray(value).reshape(-1) if self.flatten and np.ndim(value) > 1 else value

    def _infos(self) -> dict[str, Any]:
        return {a: dict(self.env.infos.get(a) or {}) for a in self.env.agents}

    def close(self) -> None:
        self.env.close()
