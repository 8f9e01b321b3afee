"""VMAS scenarios by id (``vmas/balance``, ``vmas/navigation``...): one batched torch env of ``num_envs`` envs, on
TorchRL's ``VmasWrapper``, laid out as tdrl's other multi-agent envs; the ``batched_env`` collector kind steps it
(:mod:`tdrl.collect.batched_env`).

Layout (:mod:`tdrl.envs.multiagent`'s): per agent group ``(group, "observation")`` ``[N, n, obs]`` and
``(group, "mask")`` (all True: VMAS agents never leave), actions ``(group, "action")`` (discrete actions as
indices); a step adds ``(group, "reward")`` ``[N, n, 1]``, the per-agent ``done`` / ``terminated`` /
``truncated`` (the episode's flags, for each agent), the root flags and the root ``reward``, the sum over all
agents (what TrajInfo's ``Return`` counts). VMAS's per-agent ``info`` is not kept. Group maps as
:func:`tdrl.envs.multiagent.resolve_group_map`: ``prefix`` puts ``agent_0``, ``agent_1``... in the group
``agent`` (TorchRL's own default would call it ``agents``).

Time limit: ``max_episode_steps`` (default 100, BenchMARL's VMAS tasks) ends an episode as *truncated*, counted
here. VMAS's own ``max_steps`` ends it as done with no way for TorchRL's wrapper to tell a time limit from a
termination, so BenchMARL's time-limit ends are terminated (no bootstrap) where tdrl's are truncated.

``EnvFactory`` kwargs: ``num_envs`` (the collector sets it), ``device``, ``group_map``, ``continuous_actions``
(default True) and the scenario's own (``n_agents``, ``package_mass``...).

RNG and resume: VMAS draws from one random state of its own (``Environment.vmas_random_state``: torch, numpy and
Python states that it swaps in around each call), shared by every VMAS env of a process. Each env here keeps its
own copy and swaps it in around its calls (and its CUDA generator's state, which VMAS does not isolate), so a
training and an evaluation env keep independent streams, the caller's generators are never touched, and
:meth:`VmasEnvBatch.state_dict` holds it with every tensor and plain value reachable from the VMAS env's
attributes (scenario, world, entities, their states): a resumed run continues bitwise. A scenario that keeps
state in objects of other libraries is not captured (none of VMAS's own scenarios does).
"""

from __future__ import annotations

import difflib
import enum
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey
from torchrl.data import Categorical, Composite, MultiCategorical

from tdrl.envs.families import EnvError
from tdrl.envs.make import EnvSpecs
from tdrl.envs.multiagent import resolve_group_map
from tdrl.envs.state import EnvStateError

__all__ = ["DEFAULT_MAX_STEPS", "PREFIX", "VmasEnvBatch", "make_vmas"]

PREFIX = "vmas/"
DEFAULT_MAX_STEPS = 100  # BenchMARL's VMAS tasks (balance, navigation, sampling...)
EXTRA = "pip install 'tdrl[marl]'"
_PLAIN = (bool, int, float, str, type(None))

Arrays = dict[NestedKey, torch.Tensor]


def make_vmas(env_id: str, max_episode_steps: int | None, kwargs: Mapping[str, Any]) -> VmasEnvBatch:
    """The VMAS scenario ``env_id`` (``vmas/<scenario>``) as a :class:`VmasEnvBatch`; one-line
    :class:`~tdrl.envs.EnvError` for a missing ``vmas`` or an unknown scenario."""
    try:
        import vmas
    except ImportError:
        raise EnvError(f"environment '{env_id}' needs vmas: {EXTRA}") from None
    scenario = env_id[len(PREFIX):]
    known = [*vmas.scenarios, *vmas.mpe_scenarios, *vmas.debug_scenarios]
    if scenario not in known:
        near = difflib.get_close_matches(scenario, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(PREFIX + n for n in near)}?" if near else ""
        raise EnvError(f"unknown environment id '{env_id}'{hint}")
    options = dict(kwargs)
    return VmasEnvBatch(scenario, num_envs=int(options.pop("num_envs", 1)), device=options.pop("device", "cpu"),
                        group_map=options.pop("group_map", None), max_episode_steps=max_episode_steps,
                        continuous_actions=bool(options.pop("continuous_actions", True)), scenario_kwargs=options)


class VmasEnvBatch:
    """``num_envs`` envs of one VMAS scenario, stepped together, in tdrl's grouped layout (module docstring).

    The batched-env protocol of :mod:`tdrl.collect.batched_env`: :meth:`env_specs`, :meth:`reset`, :meth:`step`,
    :meth:`reset_envs`, :meth:`state_dict` / :meth:`load_state_dict`, :meth:`close`; tensors on :attr:`device`,
    nested keys to tensors in and out.
    """

    def __init__(self, scenario: str, *, num_envs: int, device: torch.device | str = "cpu",
                 group_map: Any = None, max_episode_steps: int | None = None, continuous_actions: bool = True,
                 scenario_kwargs: Mapping[str, Any] | None = None) -> None:
        import vmas
        from torchrl.envs.libs.vmas import VmasWrapper
        from vmas.simulator.environment import Environment

        self.device = torch.device(device)
        self.scenario, self.num_envs = scenario, num_envs
        self.limit = DEFAULT_MAX_STEPS if max_episode_steps is None else int(max_episode_steps)
        self._shared = Environment.vmas_random_state  # the list VMAS's calls swap in and out (module docstring)
        self.rng = list(self._shared)
        self.cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        with self.own_rng(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self.vmas = vmas.make_env(scenario, num_envs=num_envs, device=self.device,
                                          continuous_actions=continuous_actions, seed=0, **dict(scenario_kwargs or {}))
            except TypeError as err:
                raise EnvError(f"environment '{PREFIX}{scenario}': {err}") from None
        for warning in caught:  # VMAS only warns about a scenario option it does not take (a typo): refuse it
            if "not used by the scenario" in str(warning.message):
                raise EnvError(f"environment '{PREFIX}{scenario}': {str(warning.message).split('. ')[0]}")
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        self.group_map = resolve_group_map([agent.name for agent in self.vmas.agents], group_map)
        self.env = VmasWrapper(self.vmas, group_map=self.group_map, categorical_actions=True)
        self.sizes = {group: len(agents) for group, agents in self.group_map.items()}
        self._check_groups(scenario)
        self.masks = {g: torch.ones(num_envs, n, dtype=torch.bool, device=self.device) for g, n in self.sizes.items()}
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.actions = TensorDict({g: TensorDict(batch_size=[num_envs, n], device=self.device)
                                   for g, n in self.sizes.items()}, [num_envs], device=self.device)

    def _check_groups(self, scenario: str) -> None:
        for group in self.sizes:
            if self.env.het_specs_map[group]:
                raise EnvError(f"the agents of group {group!r} of vmas/{scenario} have different observation or "
                               "action spaces; give them groups of their own (group_map=per_agent)")
            if isinstance(self.env.full_observation_spec_unbatched[group, "observation"], Composite):
                raise EnvError(f"vmas/{scenario} has dict observations, which tdrl does not take from VMAS yet")

    @contextmanager
    def own_rng(self) -> Iterator[None]:
        """Run VMAS calls on this env's random state (and CUDA generator); the caller's stay as they were."""
        theirs = list(self._shared)
        self._shared[:] = self.rng
        try:
            if self.cuda_rng is None:
                yield
            else:
                with torch.random.fork_rng(devices=[self.device], device_type="cuda"):
                    torch.cuda.set_rng_state(self.cuda_rng, self.device)
                    yield
                    self.cuda_rng = torch.cuda.get_rng_state(self.device)
        finally:
            self.rng = list(self._shared)
            self._shared[:] = theirs

    def env_specs(self) -> EnvSpecs:
        """The specs of one env (no ``num_envs`` dim), on the CPU: per group ``observation`` and ``mask``,
        ``action`` (discrete: a ``MultiCategorical`` over the group's agents, as tdrl's other multi-agent envs)."""
        observations, actions = Composite(), Composite()
        for group, n in self.sizes.items():
            obs = self.env.full_observation_spec_unbatched[group, "observation"].cpu()
            mask = Categorical(2, shape=(n,), dtype=torch.bool)
            observations[group] = Composite({"observation": obs, "mask": mask}, shape=(n,))
            action = self.env.full_action_spec_unbatched[group, "action"].cpu()
            if isinstance(action, Categorical):
                action = MultiCategorical(torch.full((n,), int(action.space.n)), dtype=torch.int64)
            actions[group] = Composite({"action": action}, shape=(n,))
        return EnvSpecs(observations, actions, max_episode_steps=self.limit)

    def _observations(self, out: TensorDict) -> Arrays:
        arrays: Arrays = {}
        for group in self.sizes:
            arrays[group, "observation"] = out.get((group, "observation"))
            arrays[group, "mask"] = self.masks[group]
        return arrays

    def reset(self, seed: int | None = None) -> Arrays:
        """Reset every env (seeded first when ``seed`` is given); their observations."""
        with self.own_rng():
            if seed is not None:
                self.env.set_seed(seed)
            out = self.env.reset()
        self.steps.zero_()
        return self._observations(out)

    def reset_envs(self, done: torch.Tensor) -> Arrays:
        """Reset the envs ``done`` (``[N]`` bool) marks; every env's observation (the others' unchanged)."""
        with self.own_rng():
            out = self.env.reset(TensorDict({"_reset": done.unsqueeze(-1)}, [self.num_envs], device=self.device))
        self.steps.masked_fill_(done, 0)
        return self._observations(out)

    def step(self, actions: Mapping[NestedKey, torch.Tensor]) -> Arrays:
        """Step every env with ``actions`` (``(group, "action")``); the ``next`` entries (module docstring)."""
        td = self.actions  # reused: TensorDict's nested constructor costs more than a step's other work here
        for group in self.sizes:
            td.get(group).set("action", actions[group, "action"].to(self.device))
        with self.own_rng():
            out = self.env.step(td).get("next")
        self.steps += 1
        terminated = out.get("terminated")
        truncated = (self.steps >= self.limit).unsqueeze(-1) & ~terminated
        flags = {"done": terminated | truncated, "terminated": terminated, "truncated": truncated}
        arrays = self._observations(out)
        total = torch.zeros(self.num_envs, 1, device=self.device)
        for group, n in self.sizes.items():
            reward = out.get((group, "reward"))
            arrays[group, "reward"] = reward
            total += reward.sum(1)
            for name, flag in flags.items():
                arrays[group, name] = flag.unsqueeze(1).expand(self.num_envs, n, 1)
        arrays["reward"] = total
        arrays.update(flags)
        return arrays

    def state_dict(self) -> dict[str, Any]:
        """Every tensor and plain value reachable from the VMAS env (copies, shared tensors once), this env's
        random state and step counts."""
        tensors: dict[int, int] = {}  # id -> index in values: a tensor two attributes share stays shared
        values: list[Any] = []
        slots: list[tuple[tuple, int]] = []
        for path, _, _, value in _leaves(self.vmas):
            if isinstance(value, torch.Tensor):
                if id(value) not in tensors:
                    tensors[id(value)] = len(values)
                    values.append(value.detach().clone())
                slots.append((path, tensors[id(value)]))
            else:
                slots.append((path, len(values)))
                values.append(value)
        return {"env": self._fingerprint(), "slots": slots, "values": values, "rng": list(self.rng),
                "cuda_rng": self.cuda_rng, "steps": self.steps.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of an env built with the same arguments. Values are matched by path; the
        ones a path of the other side lacks are VMAS's per-step scratch (its world builds ``forces_dict`` and
        ``entity_index_map`` at its first step), recomputed at the next step."""
        if state["env"] != self._fingerprint():
            raise EnvStateError(f"the VMAS env state was saved from {state['env']}, this env is {self._fingerprint()}")
        live = {path: (holder, key) for path, holder, key, _ in _leaves(self.vmas)}
        copies: dict[int, Any] = {}
        for path, index in state["slots"]:
            if path not in live:
                continue
            holder, key = live[path]
            value = state["values"][index]
            if isinstance(value, torch.Tensor):
                value = copies.setdefault(index, value.clone().to(self.device))
            if isinstance(holder, (list, dict)):
                holder[key] = value
            else:
                vars(holder)[key] = value
        self.rng = list(state["rng"])
        self.cuda_rng = state["cuda_rng"]
        self.steps.copy_(state["steps"])

    def _fingerprint(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "num_envs": self.num_envs, "group_map": self.group_map}

    def close(self) -> None:
        self.env.close()


def _is_vmas_object(value: Any) -> bool:
    """An instance of a VMAS class (or of a scenario's, which VMAS loads without a module name), not an enum."""
    module = type(value).__module__
    return (module == "" or module.startswith("vmas.")) and hasattr(value, "__dict__") \
        and not isinstance(value, (type, enum.Enum)) and not callable(value)


def _leaves(root: Any) -> Iterator[tuple[tuple, Any, Any, Any]]:
    """``(path, holder, key, value)`` for every tensor and plain value reachable from ``root`` through VMAS
    objects' attributes, lists and dicts, in a fixed order, each object visited once."""
    seen: set[int] = set()
    stack: list[tuple[tuple, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        items = (vars(node).items() if _is_vmas_object(node) else
                 node.items() if isinstance(node, dict) else enumerate(node))
        children = []
        for position, (key, value) in enumerate(items):
            step = key if isinstance(key, (str, int)) else f"#{position}"  # a dict keyed by entities: by position
            if isinstance(value, (torch.Tensor, *_PLAIN)):
                yield (*path, step), node, key, value
            elif isinstance(value, (list, dict)) or _is_vmas_object(value):
                children.append(((*path, step), value))
        stack.extend(reversed(children))
