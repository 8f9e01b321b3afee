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

from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.batch import PolicyWriter
from tdrl.collect.policy import PolicyStep
from tdrl.collect.runner import OBS_KEYS, SliceSettings, allocate
from tdrl.collect.workers import WorkerPool, get_context, worker_specs

__all__ = ["ActionServerEngine"]


class ActionServerEngine:
    """Envs in worker processes, one batched policy forward per step here.

    Args:
        n_workers: worker processes (per group); ``batch_B`` must be divisible by ``n_workers`` (times 2 when
            ``alternating``).
        alternating: two worker groups (``2 * n_workers`` processes) so env stepping and inference overlap.
        spin_s: how long the server and the workers poll for each other (yielding the core) before sleeping on
            the semaphore: saves a sleep and wake-up per step when env steps and forward passes are short. ``0``
            always sleeps.
        start_timeout, start_method: as :class:`~tdrl.collect.parallel.ParallelEngine`.
    """

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            n_workers: int = 2, alternating: bool = False, exploration: InteractionType = InteractionType.RANDOM,
            compile: bool = False, start_timeout: float = 120.0, start_method: str | None = None,
            spin_s: float = 0.0005) -> None:
        n_groups = 2 if alternating else 1
        self.transform = None  # applied where the envs are stepped, with its own state there
        self.batch_B, self.batch_T, self.policy, self.spin_s = batch_B, batch_T, policy, spin_s
        ctx = get_context(start_method)  # a fork server (if used) starts up while we build specs and buffers
        self.specs, self.step_td, self.buffer = allocate(settings, policy, batch_B, batch_T, exploration)
        self.step_td.share_memory_()
        self.buffer.share_memory_()
        size = batch_B // n_groups
        groups = [(g * size, (g + 1) * size) for g in range(n_groups)]
        self.policy_steps = [
            PolicyStep(policy, self.step_td[lo:hi].select(*OBS_KEYS).clone(), exploration_type=exploration,
                       env_offset=lo, compile=compile)
            for lo, hi in groups
        ] if policy is not None else []
        keys = list(self.policy_steps[0].out_template.keys(True, True)) if policy is not None else []
        self.writers = [PolicyWriter(self.buffer, keys, lo, hi) for lo, hi in groups]
        obs, is_init = self.step_td.get("observation"), self.step_td.get("is_init")
        self.inputs = [(obs[lo:hi], is_init[lo:hi]) for lo, hi in groups]
        n_procs = n_workers * n_groups
        self.obs_ready = [ctx.Semaphore(0) for _ in range(n_procs)]
        self.actions_ready = [ctx.Semaphore(0) for _ in range(n_procs)]
        specs = worker_specs(settings, n_procs, self.step_td, self.buffer, obs_ready=self.obs_ready,
                             actions_ready=self.actions_ready, spin_s=spin_s)
        # Workers of group g are those whose rows fall in the group's half.
        self.group_ranks = [[s.rank for s in specs if lo <= s.lo < hi] for lo, hi in groups]
        self.pool = WorkerPool(specs, start_timeout=start_timeout, start_method=start_method)

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        if not self.policy_steps:  # random actions: the workers sample them
            return self.buffer, self.pool.run_batch(("collect", exploration))
        return self.buffer, self.pool.run_batch(("serve",), lambda: self._serve(self.pool, exploration))

    def _serve(self, pool: WorkerPool, exploration: InteractionType) -> None:
        obs_ready, actions_ready, acquire, spin_s = self.obs_ready, self.actions_ready, pool.acquire, self.spin_s
        for step in self.policy_steps:
            step.exploration_type = exploration
        plan = list(zip(self.group_ranks, self.policy_steps, self.writers, self.inputs, strict=True))
        with self.policy_steps[0].running():
            for t in range(self.batch_T):
                for ranks, policy_step, write, (obs, is_init) in plan:
                    for w in ranks:
                        acquire(obs_ready[w], spin_s)
                    write(t, policy_step(obs, is_init))
                    for w in ranks:
                        actions_ready[w].release()

    def shutdown(self) -> None:
        self.pool.shutdown()
