"""Multi-agent envs as one gymnasium env over fixed agent groups: PettingZoo parallel envs (``mpe2``, any
``pettingzoo`` family) and ``lbforaging``, stepped by tdrl's collectors like any env.

:class:`GroupedEnv` turns a PettingZoo ``ParallelEnv`` into a gymnasium env whose observation is TorchRL's
multi-agent layout, one entry per agent group (RLlib's policy mapping, TorchRL's ``group_map``), each agent's row
in the group's order::

    {group: {"observation": [n, *obs], "action_mask": [n, n_actions] (if the env masks), "mask": [n] bool},
     "state": [*state] (the env's global state, if it has one)}

and whose action is ``{group: {"action": [n, ...]}}``. The collectors store them as ``(group, "observation")``,
``(group, "mask")``, ``(group, "action")``... with ``[B, T, n]`` group TensorDicts (:mod:`tdrl.collect.stepping`).

- ``(group, "mask")`` is True for the agents present when the observation is taken (in the env's ``agents``; they
  act at that step). An agent that leaves before the episode ends is masked from the next step on: its observation
  stays its final one (zeros for an agent not yet present), its ``action_mask`` all ones (a masked distribution
  stays defined), its action is not passed to the env, its reward is 0 and its done flags stay what they were
  when it left. Nothing is padded silently: the mask says which rows are agents.
- A turn-based env (PettingZoo's AEC envs, :mod:`tdrl.envs.turn_based`) names the one agent whose turn it is in
  its ``acting``: ``(group, "mask")`` is True for that agent only, the others' actions are not passed on, every
  agent's observation is there; an agent leaves when it is done (no longer in ``agents``).
- Each step's observation also carries, per group, ``reward`` ``[n, 1]`` and ``done``/``terminated``/``truncated``
  ``[n, 1]``: the collectors put them under ``("next", group, ...)``. An agent's final observation (the step it
  left) is in ``("next", group, "observation")``, with ``("next", group, "mask")`` False.
- The episode (the root done flags, TrajInfos) ends when no agent is left, or at ``max_episode_steps``
  (then every present agent is truncated). The root reward is the **sum over all agents** of their rewards (what
  TrajInfo's ``Return`` counts; divide by the number of agents for EPyMARL's per-agent convention).

Group maps (:func:`resolve_group_map`): ``"prefix"`` (the default: agents named ``<name>_<N>`` form the group
``<name>``, as TorchRL's PettingZoo wrapper groups them), ``"per_agent"``, ``"one_group"`` (one group ``agents``),
or a dict ``{group: [agent, ...]}`` naming every agent once. Agents of a group must have the same spaces.

Env ids (``mpe2/simple_spread_v3``, ``pettingzoo/<family>/<env>``, ``lbforaging/<id>``): :mod:`tdrl.envs.marl`.

Resume: :meth:`GroupedEnv.state_dict` captures the PettingZoo env's layers whole (every attribute of each wrapper
down to the raw env but rendering resources, pickled together so shared objects stay shared), which makes mpe2
and lbforaging resume bitwise; an env whose attributes do not pickle fails at its first checkpoint, naming the
attribute's type.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from tdrl.envs.families import EnvError
from tdrl.envs.pickling import canonical_dumps
from tdrl.envs.state import EnvStateError

__all__ = ["GROUP_MAPS", "GroupedEnv", "default_group_map", "resolve_group_map"]

GROUP_MAPS = ("prefix", "per_agent", "one_group")
# names the collectors use at the root of a step TensorDict: no group may take them
RESERVED_GROUPS = ("state", "is_init", "next", "action", "collector", "prev_reward", "reward", "done", "terminated",
                   "truncated")
_LINKS = ("env", "aec_env")  # the attributes through which PettingZoo and gymnasium wrappers hold the inner env
_AGENT_SUFFIX = re.compile(r"^(.*)_(\d+)$")


def default_group_map(agents: Sequence[str]) -> dict[str, list[str]]:
    """Agents named ``<name>_<N>`` grouped by ``<name>`` (``adversary_0`` -> ``adversary``), others alone."""
    groups: dict[str, list[str]] = {}
    for agent in agents:
        match = _AGENT_SUFFIX.match(agent)
        groups.setdefault(match.group(1) if match else agent, []).append(agent)
    return groups


def resolve_group_map(agents: Sequence[str], group_map: str | Mapping[str, Sequence[str]] | None
                      ) -> dict[str, list[str]]:
    """The ``{group: [agent, ...]}`` map of an env with ``agents`` (its ``possible_agents``); raises
    :class:`~tdrl.envs.EnvError` (one line) for an unknown kind, an agent the env does not have, an agent in no
    group or in two, an empty group or a reserved group name."""
    if group_map is None or group_map == "prefix":
        groups = default_group_map(agents)
    elif group_map == "per_agent":
        groups = {agent: [agent] for agent in agents}
    elif group_map == "one_group":
        groups = {"agents": list(agents)}
    elif isinstance(group_map, str):
        raise EnvError(f"unknown group_map {group_map!r}; choose one of {', '.join(GROUP_MAPS)} or a dict "
                       "{group: [agent, ...]}")
    else:
        groups = {str(group): [str(a) for a in names] for group, names in group_map.items()}
    _check_groups(agents, groups)
    return groups


def _check_groups(agents: Sequence[str], groups: dict[str, list[str]]) -> None:
    named = [agent for names in groups.values() for agent in names]
    unknown = [agent for agent in named if agent not in agents]
    if unknown:
        raise EnvError(f"group_map names agents the env does not have: {', '.join(unknown)} (its agents: "
                       f"{', '.join(agents)})")
    twice = sorted({agent for agent in named if named.count(agent) > 1})
    if twice:
        raise EnvError(f"group_map puts agents in more than one group: {', '.join(twice)}")
    missing = [agent for agent in agents if agent not in named]
    if missing:
        raise EnvError(f"group_map leaves agents in no group: {', '.join(missing)}")
    bad = [group for group, names in groups.items() if not names or group in RESERVED_GROUPS or not group]
    if bad:
        raise EnvError(f"group_map has empty groups or reserved group names: {', '.join(map(repr, bad))} "
                       f"(reserved: {', '.join(RESERVED_GROUPS)})")


@dataclass
class _Group:
    """One group's agents and how its entries are laid out."""

    name: str
    agents: list[str]
    obs_space: gym.spaces.Box | gym.spaces.Discrete
    action_space: gym.Space
    dict_obs: bool  # each agent's observation is {"observation": ..., "action_mask": ...}
    mask_from: str | None  # "obs", "info" or None: where the agents' action masks are
    n_actions: int = 0


class GroupedEnv(gym.Env):
    """A PettingZoo ``ParallelEnv`` as one gymnasium env over fixed agent groups (module docstring).

    Args:
        env: the parallel env (``possible_agents``, ``agents``, ``observation_space(agent)``,
            ``action_space(agent)``, ``reset``, ``step``; ``state()``/``state_space`` for a global state).
        group_map: see :func:`resolve_group_map`.
        max_episode_steps: end the episode (truncating the present agents) after this many steps; ``None``: the
            env's own limit only.
        state: include the env's global ``state`` when it has one.
    """

    metadata: dict[str, Any] = {}

    def __init__(self, env: Any, group_map: str | Mapping[str, Sequence[str]] | None = None,
                 max_episode_steps: int | None = None, state: bool = True) -> None:
        self.env = env
        self.max_episode_steps = max_episode_steps
        self.turn_based = hasattr(env, "acting")
        """One agent moves per step (a PettingZoo AEC env): the others' rows are masked, their turn comes later."""
        agents = list(env.possible_agents)
        self.group_map = resolve_group_map(agents, group_map)
        infos = self._probe_infos()
        self.groups = [self._layout(name, names, infos) for name, names in self.group_map.items()]
        self.has_state = bool(state) and callable(getattr(env, "state", None)) and hasattr(env, "state_space")
        spaces: dict[str, gym.Space] = {g.name: self._group_space(g) for g in self.groups}
        self.state_dtype = np.float32
        if self.has_state:
            spaces["state"] = env.state_space
            self.state_dtype = env.state_space.dtype
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Dict({
            g.name: gym.spaces.Dict({"action": _stacked(g.action_space, len(g.agents))}) for g in self.groups})
        self.steps = 0
        self.left: dict[str, tuple[bool, bool]] = {}  # agent -> (terminated, truncated) when it left
        self.held = self._zero_observations()  # each agent's last observation

    def _zero_observations(self) -> dict[str, np.ndarray]:
        return {g.name: np.zeros((len(g.agents), *(g.obs_space.shape or ())), g.obs_space.dtype) for g in self.groups}

    def _probe_infos(self) -> dict[str, Any]:
        """One reset's infos, to see whether the env puts action masks there (PettingZoo allows either place)."""
        try:
            _, infos = self.env.reset()
        except Exception as err:
            raise EnvError(f"the multi-agent env failed its first reset: {type(err).__name__}: {err}") from err
        return dict(infos or {})

    def _layout(self, name: str, agents: list[str], infos: dict[str, Any]) -> _Group:
        obs_spaces = [self.env.observation_space(a) for a in agents]
        action_spaces = [self.env.action_space(a) for a in agents]
        if any(s != obs_spaces[0] for s in obs_spaces) or any(s != action_spaces[0] for s in action_spaces):
            raise EnvError(f"the agents of group {name!r} ({', '.join(agents)}) have different observation or action "
                           "spaces; give them groups of their own (group_map)")
        obs_space, action_space = obs_spaces[0], action_spaces[0]
        dict_obs = isinstance(obs_space, gym.spaces.Dict) and "observation" in obs_space.spaces
        if dict_obs:
            mask_from = "obs" if "action_mask" in obs_space.spaces else None
            obs_space = obs_space["observation"]
        else:
            mask_from = "info" if any("action_mask" in (infos.get(a) or {}) for a in agents) else None
        if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)):
            raise EnvError(f"group {name!r}: tdrl takes Box or Discrete observations per agent, got {obs_space}")
        if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise EnvError(f"group {name!r}: tdrl takes Discrete or Box actions per agent, got {action_space}")
        if mask_from is not None and not isinstance(action_space, gym.spaces.Discrete):
            mask_from = None  # a mask over continuous actions means nothing to a policy
        n_actions = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else 0
        return _Group(name, agents, obs_space, action_space, dict_obs, mask_from, n_actions)

    @staticmethod
    def _group_space(group: _Group) -> gym.spaces.Dict:
        n = len(group.agents)
        entries: dict[str, gym.Space] = {"observation": _stacked(group.obs_space, n)}
        if group.mask_from is not None:
            entries["action_mask"] = gym.spaces.MultiBinary((n, group.n_actions))
        entries["mask"] = gym.spaces.MultiBinary(n)
        return gym.spaces.Dict(entries)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        obs, infos = self.env.reset(seed=seed, options=options)
        self.steps = 0
        self.left = {}
        self.held = self._zero_observations()
        return self._observe(obs, infos or {}), {}

    def _acting(self) -> list[str]:
        """The agents that act this step: the env's ``acting`` (a turn-based env's one player,
        :mod:`tdrl.envs.turn_based`), else all its ``agents``."""
        acting = getattr(self.env, "acting", None)
        return list(self.env.agents if acting is None else acting)

    def step(self, action: Mapping[str, Any]) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        alive, acting = set(self.env.agents), set(self._acting())
        actions = {}
        for group in self.groups:
            values = action[group.name]["action"]
            for j, agent in enumerate(group.agents):
                if agent in acting:
                    actions[agent] = int(values[j]) if group.n_actions else np.array(values[j])
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        self.steps += 1
        cut = self.max_episode_steps is not None and self.steps >= self.max_episode_steps
        out = self._observe(obs, infos or {})
        present = set(self.env.agents)
        for agent in alive:
            term, trunc = bool(terminations.get(agent, False)), bool(truncations.get(agent, False))
            if agent not in present or term or trunc or cut:
                self.left[agent] = (term, trunc or (cut and not term))
        for group in self.groups:
            entry = out[group.name]
            n = len(group.agents)
            entry["reward"] = np.array([[rewards.get(a, 0.0)] for a in group.agents], np.float32)
            flags = np.array([self.left.get(a, (False, False)) for a in group.agents], bool).reshape(n, 2)
            entry["terminated"], entry["truncated"] = flags[:, :1], flags[:, 1:]
            entry["done"] = flags[:, :1] | flags[:, 1:]
        ended = cut or not present
        terminated = ended and all(self.left.get(a, (True, False))[0] for a in self.env.possible_agents
                                   if a in self.left or a in alive)
        reward = float(sum(float(r) for r in rewards.values()))
        return out, reward, terminated, ended and not terminated, {}

    def _observe(self, obs: Mapping[str, Any], infos: Mapping[str, Any]) -> dict[str, Any]:
        present = set(self._acting())
        out: dict[str, Any] = {}
        for group in self.groups:
            n = len(group.agents)
            observation = self.held[group.name]  # an agent that left keeps its final observation
            entry: dict[str, Any] = {"observation": observation}
            action_mask = np.ones((n, group.n_actions), bool) if group.mask_from is not None else None
            for j, agent in enumerate(group.agents):
                if agent not in obs:
                    continue
                value = obs[agent]
                observation[j] = value["observation"] if group.dict_obs else value
                if action_mask is not None and agent in present:
                    source = value if group.mask_from == "obs" else (infos.get(agent) or {})
                    if "action_mask" in source:
                        action_mask[j] = np.asarray(source["action_mask"], bool)
            entry["observation"] = observation.copy()
            if action_mask is not None:
                entry["action_mask"] = action_mask
            entry["mask"] = np.array([a in present for a in group.agents], bool)
            out[group.name] = entry
        if self.has_state:
            out["state"] = np.asarray(self.env.state(), self.state_dtype)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The wrapped env's layers (every attribute but the links between them, pickled together), the step count
        and the agents that left (:mod:`tdrl.envs.state`'s protocol)."""
        layers = _chain(self.env)
        try:
            blob = canonical_dumps([{k: v for k, v in vars(layer).items() if k not in _LINKS and not _is_display(v)}
                           for layer in layers])
        except Exception as err:
            raise EnvStateError(f"the multi-agent env {type(self.env).__name__} cannot be captured for exact resume: "
                                f"{type(err).__name__}: {err}") from err
        return {"layers": blob, "classes": [type(layer).__qualname__ for layer in layers], "steps": self.steps,
                "left": dict(self.left), "held": {k: v.copy() for k, v in self.held.items()},
                "np_random": self.np_random.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        layers = _chain(self.env)
        if [type(layer).__qualname__ for layer in layers] != state["classes"]:
            raise EnvStateError(f"env state does not fit this env: its layers are {state['classes']}")
        for layer, saved in zip(layers, pickle.loads(state["layers"]), strict=True):
            vars(layer).update(saved)
        self.steps, self.left = int(state["steps"]), dict(state["left"])
        self.held = {k: np.array(v) for k, v in state["held"].items()}
        self.np_random.bit_generator.state = state["np_random"]

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _stacked(space: gym.Space, n: int) -> gym.Space:
    """``n`` agents' values of ``space`` stacked on a first axis."""
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.MultiDiscrete(np.full(n, int(space.n)), start=np.full(n, int(space.start)))
    if isinstance(space, gym.spaces.Box):
        return gym.spaces.Box(np.stack([space.low] * n), np.stack([space.high] * n), dtype=space.dtype)
    raise EnvError(f"cannot stack agents' spaces {space}")


def _is_display(value: Any) -> bool:
    """A rendering resource (a pygame surface or font, a pyglet window): not state, and not picklable."""
    return type(value).__module__.partition(".")[0] in ("pygame", "pyglet")


def _chain(env: Any) -> list[Any]:
    """``env`` and the layers it wraps (through ``aec_env`` / ``env``), outermost first."""
    layers = [env]
    while True:
        inner = next((vars(layers[-1]).get(link) for link in _LINKS if vars(layers[-1]).get(link) is not None), None)
        if inner is None or any(inner is layer for layer in layers):
            return layers
        layers.append(inner)


