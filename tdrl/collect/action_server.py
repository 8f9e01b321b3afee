"""Action-server collector (rlpyt's GpuSampler / AlternatingSampler): workers step envs, the main process acts.

Workers only step envs. Every time step, each worker records its observations into the shared batch and
releases its ``obs_ready`` semaphore; the main process waits for all of them, runs **one batched policy forward
over all B envs on the policy's own device** (GPU, or CPU — it works the same), writes the actions and every
other policy output into the shared batch and releases each worker's ``actions_ready`` semaphore. Recurrent
state lives in the main process, per env, and is zeroed where ``is_init`` marks a new episode.

``alternating=True`` forks two groups of ``n_workers`` workers, each group holding half the envs. While one
group steps its envs the main process computes the other group's actions, hiding inference time behind env
stepping (rlpyt's AlternatingActionServer: a group waits only for its own actions).

The policy here is the caller's object itself: there are no weights to copy, and an update made by the trainer
is used from the next step on. With ``policy=None`` workers take random actions themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.batch import allocate_batch
from tdrl.collect.common import (
    BufferedCollector,
    FrameBudget,
    PolicyWriter,
    active_exploration,
    check_batch_args,
    env_specs,
    game_score_of,
    load_weights,
    random_action_template,
    sorted_infos,
    to_interaction_type,
)
from tdrl.collect.policy import PolicyStep
from tdrl.collect.runner import OBS_KEYS
from tdrl.collect.stepping import make_step_td
from tdrl.collect.traj_info import unpack_entries
from tdrl.collect.workers import WorkerPool, WorkerSpec, get_context

__all__ = ["ActionServerCollector"]


class ActionServerCollector(BufferedCollector):
    """``[batch_B, batch_T]`` batches; envs in worker processes, one batched policy forward per step here.

    rlpyt's ``samples[t, b]`` (``batch_T`` × ``batch_B``) is ``batch[b, t]`` here (time last, TorchRL's layout).
    Arguments and attributes are those of :class:`~tdrl.collect.ParallelCollector` (``transform`` runs in the
    workers, where the envs are stepped, batched over each worker's envs), plus:

    Args:
        alternating: two worker groups (``2 * n_workers`` processes) so env stepping and inference overlap;
            ``batch_B`` must be divisible by ``2 * n_workers``.
        device: device of the yielded batches; the policy runs on the device of its parameters.
        spin_s: how long the server and the workers poll for each other (yielding the core) before sleeping on
            the semaphore: saves a sleep and wake-up per step when env steps and forward passes are short (CartPole:
            0.71x -> 1.0x of a SyncVectorEnv loop). ``0`` always sleeps.
    """

    def __init__(
        self,
        env_factory: Callable[..., Any],
        policy: TensorDictModuleBase | None = None,
        *,
        batch_B: int,
        batch_T: int,
        n_workers: int = 2,
        alternating: bool = False,
        total_frames: int = -1,
        seed: int = 0,
        reset_mode: str = "reset_at_once",
        max_decorrelation_steps: int = 0,
        discount: float = 0.99,
        transform: Any = None,
        exploration_type: InteractionType | str | None = None,
        device: torch.device | str | None = None,
        return_same_td: bool = False,
        fast_policy: bool = True,
        start_timeout: float = 120.0,
        start_method: str | None = None,
        spin_s: float = 0.0005,
    ) -> None:
        n_groups = 2 if alternating else 1
        check_batch_args(batch_B, batch_T, reset_mode, n_workers * n_groups)
        self.batch_B, self.batch_T, self.n_workers = batch_B, batch_T, n_workers
        self.alternating = alternating
        self.spin_s = spin_s
        self.budget = FrameBudget(total_frames, batch_B * batch_T)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.return_same_td = return_same_td
        self.policy = policy
        self.traj_infos: list[dict[str, float]] = []
        self._pool: WorkerPool | None = None
        self._exploration_arg = to_interaction_type(exploration_type, None)
        exploration = active_exploration(self._exploration_arg)
        get_context(start_method)  # a fork server (if used) starts up while we build specs and buffers
        specs = env_specs(env_factory)
        self.specs = specs
        self.step_td = make_step_td(batch_B, specs.observation_spec, transform).share_memory_()
        group_size = batch_B // n_groups
        self.groups = [(g * group_size, (g + 1) * group_size) for g in range(n_groups)]
        self.policy_steps: list[PolicyStep] = []
        if policy is not None:
            self.policy_steps = [
                PolicyStep(policy, self.step_td[lo:hi].select(*OBS_KEYS).clone(), exploration_type=exploration,
                           fast=fast_policy, env_offset=lo)
                for lo, hi in self.groups
            ]
            template = PolicyStep(policy, self.step_td.select(*OBS_KEYS).clone(), exploration_type=exploration).out_template
        else:
            template = random_action_template(specs, batch_B)
        self.buffer = allocate_batch(batch_B, batch_T, self.step_td, template).share_memory_()
        keys = list(template.keys(True, True))
        self._writers = [PolicyWriter(self.buffer, keys, lo, hi) for lo, hi in self.groups]
        self._inputs = [
            (self.step_td.get("observation")[lo:hi], self.step_td.get("is_init")[lo:hi]) for lo, hi in self.groups
        ]
        ctx = get_context(start_method)
        n_procs = n_workers * n_groups
        per = batch_B // n_procs
        self._obs_ready = [ctx.Semaphore(0) for _ in range(n_procs)]
        self._actions_ready = [ctx.Semaphore(0) for _ in range(n_procs)]
        worker_specs = [
            WorkerSpec(
                rank=w,
                lo=w * per,
                hi=(w + 1) * per,
                env_factory=env_factory,
                step_td=self.step_td,
                batch=self.buffer,
                seed=seed,
                wait_reset=reset_mode == "wait_reset",
                discount=discount,
                game_score=game_score_of(env_factory),
                max_decorrelation_steps=max_decorrelation_steps,
                transform=transform,
                obs_ready=self._obs_ready[w],
                actions_ready=self._actions_ready[w],
                spin_s=spin_s,
            )
            for w in range(n_procs)
        ]
        # Workers of group g are those whose rows fall in the group's half.
        self._group_ranks = [[w for w in range(n_procs) if lo <= w * per < hi] for lo, hi in self.groups]
        self._pool = WorkerPool(worker_specs, start_timeout=start_timeout, start_method=start_method)

    def collect(self) -> TensorDictBase:
        """Serve actions for one batch; sets :attr:`traj_infos`."""
        pool = self._pool
        if pool is None or pool._closed:
            raise RuntimeError("collector is shut down")
        try:
            if not self.policy_steps:
                pool.send(("collect", 0, None))
            else:
                pool.send(("serve",))
                self._serve(pool)
            replies = pool.gather("done")
        except BaseException:
            # A policy error, Ctrl-C or a worker failure mid-batch leaves the per-step handshake out of step.
            self.shutdown()
            raise
        self.traj_infos = sorted_infos([entry for reply in replies for entry in unpack_entries(reply[1])])
        self.budget.count()
        return self._yielded_batch()

    def _serve(self, pool: WorkerPool) -> None:
        obs_ready, actions_ready = self._obs_ready, self._actions_ready
        acquire, spin_s = pool.acquire, self.spin_s
        exploration = active_exploration(self._exploration_arg)
        for step in self.policy_steps:
            step.exploration_type = exploration
        plan = list(zip(self._group_ranks, self.policy_steps, self._writers, self._inputs, strict=True))
        with self.policy_steps[0].running():
            for t in range(self.batch_T):
                for ranks, policy_step, write, (obs, is_init) in plan:
                    for w in ranks:
                        acquire(obs_ready[w], spin_s)
                    write(t, policy_step(obs, is_init))
                    for w in ranks:
                        actions_ready[w].release()

    def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """The main process runs the caller's policy itself; given weights are loaded into it."""
        if self.policy is None or policy_or_weights is None or policy_or_weights is self.policy:
            return
        load_weights(self.policy, policy_or_weights)

    @property
    def worker_pids(self) -> list[int]:
        return list(self._pool.pids) if self._pool is not None else []

    def shutdown(self) -> None:
        """Stop the workers; safe to call more than once."""
        if self._pool is not None:
            self._pool.shutdown()

    def __repr__(self) -> str:
        return (
            f"ActionServerCollector(batch_B={self.batch_B}, batch_T={self.batch_T}, n_workers={self.n_workers}, "
            f"alternating={self.alternating}, frames={self.frames})"
        )
