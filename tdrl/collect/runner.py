"""One slice of a collector: envs ``[lo, hi)`` stepping in this process and, optionally, the policy.

The serial engine runs one :class:`SliceRunner` over all envs, the parallel engine one per worker over its
``B/W`` envs; action-server workers run only the env half (:meth:`SliceRunner.served_batch`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.data import Composite

from tdrl.collect.batch import ColumnWriter, PolicyWriter, allocate_batch, finish_slice
from tdrl.collect.common import env_specs
from tdrl.collect.layout import action_arrays, action_keys, make_step_td, observation_keys, policy_observation
from tdrl.collect.policy import PolicyStep
from tdrl.collect.stepping import EnvSlice
from tdrl.collect.traj_info import group_rewards
from tdrl.collect.transform import (
    StepTransform,
    check_is_transform,
    is_step_map,
    slice_transform,
    transformed_step_template,
)
from tdrl.envs.families import traits_of
from tdrl.envs.make import EnvSpecs

__all__ = ["SliceRunner", "SliceSettings", "allocate", "check_slices", "is_composite", "policy_keys"]

Entries = list[tuple[int, int, dict[str, float]]]


@dataclass
class SliceSettings:
    """How a collector's envs are built and stepped (the same for every slice; pickled to workers); the fields are
    :func:`~tdrl.collect.factory.make_collector`'s arguments."""

    env_factory: Callable[..., Any]
    seed: int = 0
    wait_reset: bool = False
    max_decorrelation_steps: int = 0
    discount: float = 0.99
    transform: Any = None
    env_protocol: bool = False  # run even a per-step map transform through the env protocol (the evaluator's)

    @property
    def game_score(self) -> bool:
        """The envs' TrajInfos add ``GameScore`` (their family's trait: Atari)."""
        return traits_of(self.env_factory).game_score


def allocate(settings: SliceSettings, policy: TensorDictModuleBase | None, batch_B: int, batch_T: int,
        exploration: InteractionType) -> tuple[EnvSpecs, TensorDict, TensorDict]:
    """The env specs, the ``[B]`` step TensorDict and the zero ``[B, T]`` batch with the policy's output keys
    (only the actions for ``policy=None``: random actions). Warns (once, here in the main process) when the env's
    state cannot be checkpointed."""
    specs = env_specs(settings.env_factory)
    if specs.capture_problem is not None:
        warnings.warn(f"the collector cannot checkpoint its envs' state ({specs.capture_problem}); a resumed run "
                      "restarts their episodes", stacklevel=2)
    step_td = make_step_td(batch_B, specs.observation_spec)
    if settings.transform is not None:
        if is_composite(specs):
            raise ValueError("transform= needs an env with an array observation; this env's observation is a dict "
                             f"({', '.join(map(str, observation_keys(step_td)))})")
        check_is_transform(settings.transform)
        if settings.env_protocol or not is_step_map(settings.transform):  # the env protocol's keys and shapes
            step_td = transformed_step_template(settings.transform, specs, batch_B)
    if policy is None:
        actions = specs.action_spec.zero((batch_B,))
        template = actions if isinstance(actions, TensorDictBase) else TensorDict({"action": actions}, [batch_B])
    else:
        obs_keys, act_keys = policy_keys(specs, step_td)
        template = PolicyStep(policy, step_td, exploration_type=exploration, obs_keys=obs_keys,
                              action_keys=act_keys).out_template
    return specs, step_td, allocate_batch(batch_B, batch_T, step_td, template)


def is_composite(specs: EnvSpecs) -> bool:
    """Whether the env's observation is a dict (:mod:`tdrl.collect.stepping`'s composite path)."""
    return isinstance(specs.observation_spec, Composite)


def policy_keys(specs: EnvSpecs, step_td: TensorDictBase) -> tuple[list[NestedKey], list[NestedKey]]:
    """:class:`~tdrl.collect.policy.PolicyStep`'s ``obs_keys`` and ``action_keys`` for this env."""
    obs_keys = observation_keys(step_td) if is_composite(specs) else ["observation"]
    return obs_keys, action_keys(specs.action_spec)


class SliceRunner:
    """Collects rows ``lo:hi`` of the ``[B, T]`` ``batch`` through the ``[B]`` ``step_td`` (both shared when
    several processes use them), running ``policy`` here (a private copy in workers) or, for ``None``, taking
    random actions or those an action server writes into the batch."""

    def __init__(self, settings: SliceSettings, lo: int, hi: int, step_td: TensorDictBase, batch: TensorDictBase,
            policy: TensorDictModuleBase | None, exploration: InteractionType = InteractionType.RANDOM,
            compile: bool = False) -> None:
        self.lo, self.hi = lo, hi
        self.batch = batch
        self.n_total, self.batch_T = int(batch.batch_size[0]), int(batch.batch_size[1])
        self.wait_reset = settings.wait_reset
        rows = step_td[lo:hi]
        # the slice's own copy (TorchRL's clone): the collector's transform stays an unused template, which an
        # evaluator copies (a clone of a VecNorm that has run shares its statistics' storage)
        transform = None if settings.transform is None else settings.transform.clone()
        # a transform run through the env protocol reads the envs' raw steps from arrays of its own
        specs = env_specs(settings.env_factory)
        in_place = transform is None or (is_step_map(transform) and not settings.env_protocol)
        raw = None if in_place else make_step_td(hi - lo, specs.observation_spec)
        self.envs = EnvSlice(settings, lo, hi, rows if raw is None else raw, batch_T=self.batch_T,
                             defer_resets=raw is not None)
        try:
            self.envs.start(settings.max_decorrelation_steps)
            obs_keys, act_keys = policy_keys(specs, rows)
            self.obs, self.is_init = policy_observation(rows, obs_keys), rows.get("is_init")
            self.transform = None
            if transform is not None:  # a TorchRL transform on this slice's steps (tdrl.collect.transform)
                self.transform = slice_transform(transform, specs, raw, rows,
                                                 self.envs.reset_rows, wait_reset=self.wait_reset)
                self.transform.after_reset()
            self.policy_step = None
            if policy is not None:
                self.policy_step = PolicyStep(policy, rows, exploration_type=exploration, env_offset=lo,
                                              compile=compile, obs_keys=obs_keys, action_keys=act_keys)
        except BaseException:
            self.envs.close()
            raise
        next_keys = [("next", *k) if isinstance(k, tuple) else ("next", k)
                     for k in step_td.get("next").keys(True, True)]
        root_keys = [k for k in step_td.keys(True, True) if k not in next_keys]
        self.write_obs = ColumnWriter(batch, root_keys, step_td, lo, hi)
        self.write_next = ColumnWriter(batch, next_keys, step_td, lo, hi)
        self.write_policy: PolicyWriter | None = None
        if self.policy_step is not None:
            self.write_policy = PolicyWriter(batch, list(self.policy_step.out_template.keys(True, True)), lo, hi)
        self.actions = action_arrays(batch, action_keys(specs.action_spec), lo, hi)

    def run_batch(self, exploration: InteractionType) -> Entries:
        """Collect ``T`` steps of this slice (policy here or random actions); returns finished episodes."""
        envs, policy_step, actions = self.envs, self.policy_step, self.actions
        write_obs, write_next, write_policy = self.write_obs, self.write_next, self.write_policy
        obs, is_init = self.obs, self.is_init
        if policy_step is not None:
            policy_step.exploration_type = exploration
        with policy_step.running() if policy_step is not None else nullcontext():
            for t in range(self.batch_T):
                write_obs(t)
                if policy_step is not None:
                    assert write_policy is not None  # built with policy_step
                    write_policy(t, policy_step(obs, is_init))
                else:
                    envs.sample_actions(actions[:, t])
                envs.step(t, actions[:, t])
                if self.transform is not None:
                    self._transform_step(t)
                write_next(t)
        return self.end_batch()

    def served_batch(self, obs_ready: Any, actions_ready: Any, wait: Callable[[Any], None]) -> Entries:
        """Collect ``T`` steps with actions served by another process (action-server worker side).

        Per step: record the observation into the batch while the server computes actions from the same step
        arrays, wait for ``actions_ready`` (the server wrote ``action`` and the other policy outputs into the
        batch), step the envs, ``obs_ready.release()`` for the next step, then record the step's results while
        the server computes again.
        """
        envs, actions = self.envs, self.actions
        write_obs, write_next = self.write_obs, self.write_next
        last = self.batch_T - 1
        obs_ready.release()  # the step arrays already hold the first observation
        for t in range(self.batch_T):
            write_obs(t)
            wait(actions_ready)
            envs.step(t, actions[:, t])
            if self.transform is not None:
                self._transform_step(t)
            if t < last:
                obs_ready.release()
            write_next(t)
        return self.end_batch()

    def _transform_step(self, t: int) -> None:
        assert self.transform is not None
        done = self.transform.after_step(self.actions[:, t])
        if done is not None:  # the env protocol's done flags end the episodes (and reset the envs)
            self.envs.end_episodes(t, done)

    def end_batch(self) -> Entries:
        envs = self.envs
        valid = envs.valid_mask()
        rewards = group_rewards(self.batch, envs.groups, self.lo, self.hi) if envs.groups else None
        entries = envs.batch_traj_infos(valid if self.wait_reset else None, rewards)
        finish_slice(self.batch, self.lo, self.hi, valid, envs.traj_ids(self.n_total), self.wait_reset)
        return entries

    def finish_batch(self) -> None:
        """Wait-reset: reset finished envs (workers do it after replying, while the trainer is busy)."""
        if self.transform is not None and not isinstance(self.transform, StepTransform):
            self.transform.finish_batch()  # resets them through the transformed env
        else:
            self.envs.finish_batch()

    def state_dict(self) -> dict[str, Any]:
        """This slice's envs and episodes (:meth:`EnvSlice.state_dict`) and the policy's recurrent state; read
        between batches (after :meth:`finish_batch`)."""
        return {"lo": self.lo, "hi": self.hi, "envs": self.envs.state_dict(),
                "policy": None if self.policy_step is None else self.policy_step.state_dict(),
                "transform": None if self.transform is None else self.transform.state_dict(),
                "transform_episodes": None if self.transform is None else self.transform.episode_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of the same slice of a collector built with the same arguments."""
        check_slices([state], [(self.lo, self.hi)])
        self.envs.load_state_dict(state["envs"])
        if self.policy_step is not None and state["policy"] is not None:
            self.policy_step.load_state_dict(state["policy"])
        if self.transform is not None and state.get("transform") is not None:
            self.transform.load_state_dict(state["transform"])
            if state.get("transform_episodes") is not None:  # absent in checkpoints from before it was saved
                self.transform.load_episode_state(state["transform_episodes"])

    def close(self) -> None:
        self.envs.close()


def check_slices(saved: Sequence[dict[str, Any]], ranges: Sequence[tuple[int, int]]) -> None:
    """Raise ``ValueError`` unless the saved slices cover the same env rows as this collector's (``ranges``)."""
    saved_ranges = [(int(s["lo"]), int(s["hi"])) for s in saved]
    if saved_ranges != list(ranges):
        raise ValueError(f"the collector state was saved over env slices {saved_ranges}, this collector has "
                         f"{list(ranges)}: build it with the same batch_B, kind and n_workers")
