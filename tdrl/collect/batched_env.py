"""Batched-env engine (``make_collector("batched_env", ...)``, ``collector.kind=batched_env``): one env object that
simulates all ``batch_B`` envs at once in torch (VMAS: :mod:`tdrl.envs.vmas`), stepped in this process with the
policy here. No worker processes and no numpy on the hot path: the batch stays on the simulator's device.

The env is what its factory builds with ``num_envs=batch_B`` (:func:`build_batched_env`), an object with the
:class:`BatchedEnv` methods; its family has the ``batched`` trait (:class:`tdrl.envs.EnvTraits`), and the other
kinds refuse it, as this kind refuses gymnasium envs (:func:`check_kind`). Batches have the layout of every kind
(:mod:`tdrl.collect.batch`, agent groups as :mod:`tdrl.collect.layout` lays them out); TrajInfos count the root
reward (a multi-agent env's: summed over its agents). Reset-at-once (done envs are reset at once, together) or
wait-reset (the evaluator: done envs idle, their steps zeroed and masked, until the batch ends); TrajInfos add each
agent group's return (``"<group>/Return"``, :mod:`tdrl.collect.traj_info`). No transforms and
no decorrelation steps. The seed goes to the env once (``env_seed(seed, 0)``); ``state_dict`` holds the env's own
(:meth:`BatchedEnv.state_dict`), the observations, the episodes in progress and recurrent policy state.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any, Protocol

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase
from tensordict.utils import NestedKey

from tdrl.collect.batch import allocate_batch
from tdrl.collect.common import sorted_infos
from tdrl.collect.layout import action_keys, group_keys, make_step_td, observation_keys, policy_observation
from tdrl.collect.policy import PolicyStep
from tdrl.collect.runner import SliceSettings
from tdrl.collect.stepping import env_seed
from tdrl.collect.traj_info import EpisodeTracker, group_name, group_rewards
from tdrl.envs.families import traits_of
from tdrl.envs.make import EnvFactory, EnvSpecs
from tdrl.utils.errors import UserError
from tdrl.utils.keys import INIT_KEY, MASK_KEY, TRAJ_KEY

__all__ = ["KIND", "BatchedEnv", "BatchedEnvEngine", "build_batched_env", "check_kind"]

KIND = "batched_env"
Arrays = dict[NestedKey, torch.Tensor]


class BatchedEnv(Protocol):
    """``num_envs`` envs stepped together (:class:`tdrl.envs.vmas.VmasEnvBatch`); tensors are ``[num_envs, ...]``
    on ``device``, keyed as the batch keys them (``(group, "observation")``, ``"reward"``, ``"done"``...)."""

    num_envs: int
    device: torch.device

    def env_specs(self) -> EnvSpecs:
        """The specs of one env (``capture_problem`` set when :meth:`state_dict` cannot capture it)."""

    def reset(self, seed: int | None = None) -> Arrays:
        """Reset every env; the observation entries."""

    def reset_envs(self, done: torch.Tensor) -> Arrays:
        """Reset the envs ``done`` (``[num_envs]`` bool) marks; every env's observation entries."""

    def step(self, actions: Mapping[NestedKey, torch.Tensor]) -> Arrays:
        """One step of every env: the ``next`` entries (observations, rewards, ``done``/``terminated``/
        ``truncated``), without the ``"next"`` prefix."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def check_kind(kind: str, env_factory: Callable[..., Any]) -> None:
    """A one-line :class:`~tdrl.utils.errors.UserError` where ``kind`` cannot step the factory's envs: a batched
    torch env (a family with the ``batched`` trait) steps with ``batched_env`` only, and ``batched_env`` steps
    nothing else."""
    batched = traits_of(env_factory).batched
    name = getattr(env_factory, "env_id", type(env_factory).__name__)
    if kind == KIND and not batched:
        raise UserError(f"collector.kind={KIND} steps batched torch envs (vmas/...); '{name}' is a gymnasium env: "
                        "use collector.kind=serial, parallel, action_server or alternating")
    if kind != KIND and batched:
        raise UserError(f"environment '{name}' is a batched torch env (num_envs envs in one object): it steps with "
                        f"collector.kind={KIND}, not {kind}")


def build_batched_env(env_factory: Callable[..., Any], num_envs: int, device: torch.device | str | None) -> Any:
    """The factory's env of ``num_envs`` envs: an :class:`~tdrl.envs.EnvFactory` (its ``env_id`` and ``kwargs``)
    gets ``num_envs`` and, unless its kwargs name one, ``device``; another callable is called with both."""
    options = {"num_envs": num_envs, "device": torch.device("cpu" if device is None else device)}
    if isinstance(env_factory, EnvFactory):
        return dataclasses.replace(env_factory, kwargs={**options, **env_factory.kwargs, "num_envs": num_envs})()
    return env_factory(**options)


def _path(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


class BatchedEnvEngine:
    """Steps one :class:`BatchedEnv` of ``batch_B`` envs for ``batch_T`` steps per batch, with ``policy`` here
    (``None``: random actions from the action spec, drawn from the caller's torch generator)."""

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            exploration: InteractionType = InteractionType.RANDOM, device: torch.device | str | None = None,
            compile: bool = False) -> None:
        if settings.transform is not None:
            raise UserError(f"collector kind {KIND} takes no transform= (its envs step as one torch object)")
        if settings.max_decorrelation_steps:
            raise UserError(f"collector kind {KIND} takes no decorrelation steps (its envs step together)")
        self.batch_B, self.batch_T, self.policy = batch_B, batch_T, policy
        self.wait_reset = settings.wait_reset
        self.env: BatchedEnv = build_batched_env(settings.env_factory, batch_B, device)
        try:
            self._build(settings, policy, exploration, compile)
        except BaseException:
            self.env.close()
            raise

    def _build(self, settings: SliceSettings, policy: TensorDictModuleBase | None, exploration: InteractionType,
               compile: bool) -> None:
        specs = self.env.env_specs()
        if specs.capture_problem is not None:
            warnings.warn(f"the collector cannot checkpoint its envs' state ({specs.capture_problem}); a resumed run "
                          "restarts their episodes", stacklevel=4)
        device, B = self.env.device, self.batch_B
        self.action_spec, self.action_keys = specs.action_spec, action_keys(specs.action_spec)
        self.step_td = make_step_td(B, specs.observation_spec).to(device)
        obs_keys = observation_keys(self.step_td)
        self.policy_step: PolicyStep | None = None
        if policy is None:
            template = self.action_spec.zero((B,))
        else:
            self.policy_step = PolicyStep(policy, self.step_td, exploration_type=exploration, compile=compile,
                                          obs_keys=obs_keys, action_keys=self.action_keys)
            template = self.policy_step.out_template
        self.buffer = allocate_batch(B, self.batch_T, self.step_td, template)
        if device.type != "cpu":
            self.buffer = self.buffer.to(device)
        self.obs = policy_observation(self.step_td, obs_keys)
        self.is_init = self.step_td.get(INIT_KEY)
        self.next_td = self.step_td.get("next")
        self.root_keys = [*obs_keys, INIT_KEY]
        self.out_keys = list(template.keys(True, True))
        self.next_keys = list(self.next_td.keys(True, True))
        self.groups = group_keys(self.step_td)  # agent groups: TrajInfos add each one's return
        self.tracker = EpisodeTracker(B, discount=settings.discount, game_score=settings.game_score,
                                      groups=[group_name(key) for key in self.groups])
        self.episode_count = np.zeros(B, np.int64)
        self.idle = torch.zeros(B, dtype=torch.bool, device=device)
        self._observe(self.env.reset(seed=env_seed(settings.seed, 0)))
        self.is_init.fill_(True)

    def _observe(self, arrays: Arrays, rows: torch.Tensor | None = None) -> None:
        """Copy observation entries into the step rows (only ``rows``, a ``[B]`` bool mask, when given)."""
        for key in self.root_keys[:-1]:
            dst, src = self.step_td.get(key), arrays[key]
            if rows is None:
                dst.copy_(src)
            else:
                dst.copy_(torch.where(rows.view(-1, *[1] * (dst.dim() - 1)), src, dst))

    def _act(self) -> Mapping[NestedKey, torch.Tensor]:
        if self.policy_step is None:
            return self.action_spec.rand((self.batch_B,)).to(self.env.device).items(True, True)
        return self.policy_step(self.obs, self.is_init)

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        buffer, env, policy_step = self.buffer, self.env, self.policy_step
        root = [(buffer.get(key), self.step_td.get(key)) for key in self.root_keys]
        outs = [(buffer.get(key), key) for key in self.out_keys]
        nexts = [(buffer.get(("next", *key) if isinstance(key, tuple) else ("next", key)), key)
                 for key in self.next_keys]
        if policy_step is not None:
            policy_step.exploration_type = exploration
        with policy_step.running() if policy_step is not None else nullcontext():
            for t in range(self.batch_T):
                for dst, src in root:
                    dst[:, t].copy_(src)
                out = dict(self._act())
                for dst, key in outs:
                    dst[:, t].copy_(out[key])
                arrays = env.step({key: out[key] for key in self.action_keys})
                for dst, key in nexts:
                    dst[:, t].copy_(arrays[key])
                self.next_td.get("reward").copy_(arrays["reward"])  # a policy's prev_reward
                self._after_step(arrays)
        entries = self._finish_batch()
        return buffer, sorted_infos(entries)

    def _after_step(self, arrays: Arrays) -> None:
        """The next observation, with done envs reset at once (reset-at-once) or left idle (wait-reset)."""
        done = arrays["done"][:, 0]
        self._observe(arrays)
        if self.wait_reset:
            self.idle |= done
            self.is_init.fill_(False)
            return
        self.is_init.copy_(done.unsqueeze(-1))
        if bool(done.any()):
            self._observe(self.env.reset_envs(done), done)

    def _finish_batch(self) -> list[tuple[int, int, dict[str, float]]]:
        """TrajInfos, episode ids, and wait-reset's masking (then its reset of the envs that finished)."""
        done = self.buffer.get(("next", "done"))[..., 0]
        before = done.cumsum(1) - done.long()  # episodes ended before each step
        valid = before == 0 if self.wait_reset else None
        dones_np = done.cpu().numpy()
        rewards = self.buffer.select(("next", "reward"), *[("next", *_path(key), "reward") for key in self.groups])
        rewards = rewards.cpu() if rewards.device is not None and rewards.device.type != "cpu" else rewards
        entries = self.tracker.add(rewards.get(("next", "reward"))[..., 0].numpy(), dones_np,
                                   None if valid is None else valid.cpu().numpy(),
                                   group_rewards=group_rewards(rewards, self.groups) if self.groups else None)
        index = torch.arange(self.batch_B, device=done.device).unsqueeze(1)
        count = torch.as_tensor(self.episode_count, device=done.device).unsqueeze(1)
        traj = (count + (0 if valid is not None else before)) * self.batch_B + index
        self.episode_count += dones_np.any(1) if valid is not None else dones_np.sum(1)
        if valid is None:
            self.buffer.get(TRAJ_KEY).copy_(traj)
            return entries
        self.buffer.get(MASK_KEY).copy_(valid)
        self.buffer.get(TRAJ_KEY).copy_(torch.where(valid, traj, -1))
        for key, value in self.buffer.items(True, True):
            if key not in (MASK_KEY, TRAJ_KEY):
                value.mul_(valid.view(*valid.shape, *[1] * (value.dim() - 2)).to(value.dtype))
        if bool(self.idle.any()):
            self._observe(self.env.reset_envs(self.idle), self.idle)
            self.is_init.copy_(self.idle.unsqueeze(-1))
            self.idle.fill_(False)
        return entries

    def state_dict(self) -> dict[str, Any]:
        """As a slice's (:meth:`tdrl.collect.stepping.EnvSlice.state_dict`): the env's state (one entry of
        ``envs``), the step rows (``observation``, with the last reward a policy's ``prev_reward`` reads),
        ``is_init``, wait-reset idle flags, the episodes in progress, the episode counters and the recurrent policy
        state; the caller's torch RNG is the caller's."""
        rows = self.step_td.exclude(INIT_KEY)
        return {"envs": [self.env.state_dict()], "observation": {k: v.cpu().clone() for k, v in rows.items(True, True)},
                "is_init": self.is_init.cpu().clone(), "idle": self.idle.cpu().clone(),
                "episodes": self.tracker.state_dict(), "episode_count": self.episode_count.copy(),
                "policy": None if self.policy_step is None else self.policy_step.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        observation = state["observation"]
        rows = self.step_td.exclude(INIT_KEY)
        if set(observation) != set(rows.keys(True, True)) or len(observation["next", "reward"]) != self.batch_B:
            raise ValueError(f"the collector state was saved with other envs; build it with the same env, batch_B "
                             f"({self.batch_B}) and kind")
        (env_state,) = state["envs"]
        self.env.load_state_dict(env_state)
        for key, value in observation.items():
            self.step_td.get(key).copy_(value)
        self.is_init.copy_(state["is_init"])
        self.idle.copy_(state["idle"])
        self.tracker.load_state_dict(state["episodes"])
        self.episode_count[:] = state["episode_count"]
        if self.policy_step is not None and state["policy"] is not None:
            self.policy_step.load_state_dict(state["policy"])

    def shutdown(self) -> None:
        self.env.close()
