"""Cooperative one-step matrix games (climbing, penalty): the smallest tests of multi-agent value learning.

Two agents each pick one of three actions, the team shares one payoff, the episode ends: the whole problem is the
payoff matrix, so what a learner converges to can be checked against values computed by hand. The games are Claus &
Boutilier's (1998, "The Dynamics of Reinforcement Learning in Cooperative Multiagent Systems", AAAI): the climbing
game punishes a miscoordinated step towards its optimum (0, 0) -> 11 with -30, the penalty game has two optima
(0, 2) and (2, 0) -> 10 and punishes mixing them with ``k``. EPyMARL's ``matrixgames`` package holds the same
games (its climbing matrix is this one transposed, the agents swapped).

:class:`MatrixGame` is a TorchRL env in TorchRL's grouped convention, the one tdrl's multi-agent code uses:

| key | shape | |
|---|---|---|
| ``("agents", "observation")`` | ``[*B, 2, 2]`` | the agent's one-hot id: constant, so only the actions matter |
| ``("agents", "mask")`` | ``[*B, 2]`` bool | agent present (always, here) |
| ``"state"`` | ``[*B, 1]`` | a constant global state (QMIX's hypernetworks read it) |
| ``("agents", "action")`` | ``[*B, 2]`` int64 | categorical |
| ``("next", "reward")`` | ``[*B, 1]`` | the team reward |
| ``("next", "agents", "reward")`` | ``[*B, 2, 1]`` | the same, per agent |
| ``("next", "done" / "terminated")`` | ``[*B, 1]`` bool | True: one step per episode |

:class:`MatrixGameParallel` is the same game as a PettingZoo ``ParallelEnv``, for tdrl's collectors through
:class:`tdrl.envs.multiagent.GroupedEnv` (``group_map="one_group"``); there, as for every multi-agent env, the root
``("next", "reward")`` is the sum over agents: twice the payoff.
"""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

__all__ = ["CLIMBING", "MatrixGame", "MatrixGameParallel", "climbing_game", "every_joint_action", "penalty_game",
           "penalty_payoff"]

GROUP = "agents"
CLIMBING = torch.tensor([[11.0, -30.0, 0.0], [-30.0, 7.0, 6.0], [0.0, 0.0, 5.0]])


def penalty_payoff(k: float = -100.0) -> torch.Tensor:
    """The penalty game's payoff: optima (0, 2) and (2, 0) -> 10, their mix (0, 0) or (2, 2) -> ``k`` <= 0."""
    if k > 0:
        raise ValueError(f"the penalty game's k is a penalty, <= 0; got {k}")
    return torch.tensor([[k, 0.0, 10.0], [0.0, 2.0, 0.0], [10.0, 0.0, k]])


class MatrixGame(EnvBase):
    """A cooperative one-step game: ``payoff[a_0, a_1, ...]`` is the team reward of the joint action.

    ``payoff`` has one dimension per agent, each of the same size (the number of actions); ``batch_size`` runs that
    many games side by side.
    """

    def __init__(self, payoff: torch.Tensor, *, batch_size: torch.Size | tuple[int, ...] = (),
                 group: str = GROUP, device: torch.device | str | None = None) -> None:
        payoff = torch.as_tensor(payoff, dtype=torch.float32)
        if payoff.ndim < 2 or len(set(payoff.shape)) != 1:
            raise ValueError(f"payoff needs one equal-sized dimension per agent (>= 2), got {tuple(payoff.shape)}")
        super().__init__(batch_size=torch.Size(batch_size), device=device)
        self.payoff = payoff.to(self.device)
        self.group, self.n_agents, self.n_actions = group, payoff.ndim, payoff.shape[0]
        batch, agents = self.batch_size, (*self.batch_size, self.n_agents)
        self.observation_spec = Composite(
            {group: Composite(observation=Unbounded((*agents, self.n_agents)),
                              mask=Categorical(2, agents, dtype=torch.bool), shape=agents),
             "state": Unbounded((*batch, 1))}, shape=batch)
        self.action_spec = Composite({group: Composite(action=Categorical(self.n_actions, agents), shape=agents)},
                                     shape=batch)
        self.reward_spec = Composite({"reward": Unbounded((*batch, 1)),
                                      group: Composite(reward=Unbounded((*agents, 1)), shape=agents)}, shape=batch)
        self.done_spec = Composite(done=Categorical(2, (*batch, 1), dtype=torch.bool),
                                   terminated=Categorical(2, (*batch, 1), dtype=torch.bool), shape=batch)

    def _observation(self) -> TensorDict:
        agents = (*self.batch_size, self.n_agents)
        ids = torch.eye(self.n_agents, device=self.device).expand(*agents, self.n_agents)
        return TensorDict({self.group: TensorDict(observation=ids.clone(),
                                                  mask=torch.ones(agents, dtype=torch.bool, device=self.device),
                                                  batch_size=agents),
                           "state": torch.ones(*self.batch_size, 1, device=self.device)},
                          batch_size=self.batch_size, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: object) -> TensorDict:
        out = self._observation()
        out.update(self.full_done_spec.zero())
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDict:
        action = tensordict.get((self.group, "action")).long()
        reward = self.payoff[action.unbind(-1)].unsqueeze(-1)  # [*B, 1]
        out = self._observation()
        out.set("reward", reward)
        out.set((self.group, "reward"), reward.unsqueeze(-2).expand(*self.batch_size, self.n_agents, 1).clone())
        done = torch.ones(*self.batch_size, 1, dtype=torch.bool, device=self.device)
        out.set("done", done)
        out.set("terminated", done.clone())
        return out

    def _set_seed(self, seed: int | None) -> None:
        pass  # deterministic: the payoff is the whole game


class MatrixGameParallel:
    """``payoff`` as a PettingZoo ``ParallelEnv`` (its protocol, without importing pettingzoo): agents ``agent_<i>``
    observe their one-hot id, each is paid the payoff, all leave after one step; ``state()`` is a constant."""

    metadata: dict[str, Any] = {}

    def __init__(self, payoff: torch.Tensor) -> None:
        self.payoff = np.asarray(payoff, dtype=np.float32)
        self.possible_agents = [f"agent_{i}" for i in range(self.payoff.ndim)]
        self.agents: list[str] = []
        self.state_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return gym.spaces.Box(0.0, 1.0, (len(self.possible_agents),), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return gym.spaces.Discrete(self.payoff.shape[0])

    def _observations(self) -> dict[str, np.ndarray]:
        ids = np.eye(len(self.possible_agents), dtype=np.float32)
        return {agent: ids[i] for i, agent in enumerate(self.possible_agents)}

    def state(self) -> np.ndarray:
        return np.ones(1, np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        return self._observations(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        reward = float(self.payoff[tuple(int(actions[agent]) for agent in self.possible_agents)])
        everyone, self.agents = self.agents, []
        return (self._observations(), {a: reward for a in everyone}, {a: True for a in everyone},
                {a: False for a in everyone}, {a: {} for a in everyone})


def climbing_game(**kwargs: Any) -> MatrixGame:
    """Claus & Boutilier's climbing game: optimum (0, 0) -> 11, guarded by -30 on both miscoordinations."""
    return MatrixGame(CLIMBING, **kwargs)


def penalty_game(k: float = -100.0, **kwargs: Any) -> MatrixGame:
    """Claus & Boutilier's penalty game (:func:`penalty_payoff`)."""
    return MatrixGame(penalty_payoff(k), **kwargs)


def every_joint_action(game: MatrixGame) -> TensorDictBase:
    """One transition of each joint action, ``[n_actions ** n_agents]``: the data of a full, uniform exploration.

    Built by stepping ``game``'s payoff in a batch of that size, so the rows hold exactly the keys the env writes.
    """
    joint = torch.tensor(list(itertools.product(range(game.n_actions), repeat=game.n_agents)))
    env = MatrixGame(game.payoff, batch_size=(len(joint),), group=game.group, device=game.device)
    td = env.reset()
    td.set((game.group, "action"), joint.to(env.device))
    return env.step(td)
