"""Action-server engine (rlpyt's GpuSampler / AlternatingSampler): workers step envs, the main process acts.

Every time step, each worker records its observations into the shared batch and releases its ``obs_ready``
semaphore; the main process runs one batched policy forward over all envs on the policy's own device, writes the
policy outputs into the shared batch and releases each worker's ``actions_ready``. The policy is the caller's
object itself (no weights to copy); recurrent state lives here, per env. With ``policy=None`` workers take random
actions themselves.

``alternating=True`` runs two worker groups, each holding half the envs: while one group steps its envs the main
process computes the other group's actions, hiding inference behind env stepping.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.batch import PolicyWriter
from tdrl.collect.layout import policy_observation
from tdrl.collect.policy import PolicyStep
from tdrl.collect.runner import SliceSettings, allocate, check_slices, policy_keys
from tdrl.collect.workers import WorkerPool, acquire, get_context, worker_specs

__all__ = ["ActionServerEngine"]


class ActionServerEngine:
    """Envs in ``n_workers`` worker processes per group (two groups when ``alternating``), one batched policy
    forward per step here."""

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            n_workers: int = 2, alternating: bool = False, exploration: InteractionType = InteractionType.RANDOM,
            compile: bool = False) -> None:
        n_groups = 2 if alternating else 1
        self.batch_B, self.batch_T, self.policy = batch_B, batch_T, policy
        ctx = get_context()  # a fork server (if used) starts up while we build specs and buffers
        self.specs, self.step_td, self.buffer = allocate(settings, policy, batch_B, batch_T, exploration)
        self.step_td.share_memory_()
        self.buffer.share_memory_()
        size = batch_B // n_groups
        groups = [(g * size, (g + 1) * size) for g in range(n_groups)]
        obs_keys, act_keys = policy_keys(self.specs, self.step_td)
        self.policy_steps = [PolicyStep(policy, self.step_td[lo:hi], exploration_type=exploration, env_offset=lo,
                                        compile=compile, obs_keys=obs_keys, action_keys=act_keys)
                             for lo, hi in groups] if policy is not None else []
        keys = list(self.policy_steps[0].out_template.keys(True, True)) if policy is not None else []
        self.writers = [PolicyWriter(self.buffer, keys, lo, hi) for lo, hi in groups]
        self.inputs = [(policy_observation(self.step_td[lo:hi], obs_keys),
                        self.step_td.get("is_init")[lo:hi]) for lo, hi in groups]
        n_procs = n_workers * n_groups
        self.obs_ready = [ctx.Semaphore(0) for _ in range(n_procs)]
        self.actions_ready = [ctx.Semaphore(0) for _ in range(n_procs)]
        specs = worker_specs(settings, n_procs, self.step_td, self.buffer, obs_ready=self.obs_ready,
                             actions_ready=self.actions_ready)
        # Workers of group g are those whose rows fall in the group's half.
        self.group_ranks = [[s.rank for s in specs if lo <= s.lo < hi] for lo, hi in groups]
        self.pool = WorkerPool(specs)

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        if not self.policy_steps:  # random actions: the workers sample them
            return self.buffer, self.pool.run_batch(("collect", exploration))
        return self.buffer, self.pool.run_batch(("serve",), lambda: self._serve(self.pool, exploration))

    def _serve(self, pool: WorkerPool, exploration: InteractionType) -> None:
        obs_ready, actions_ready, check = self.obs_ready, self.actions_ready, pool.check
        for step in self.policy_steps:
            step.exploration_type = exploration
        plan = list(zip(self.group_ranks, self.policy_steps, self.writers, self.inputs, strict=True))
        with self.policy_steps[0].running():
            for t in range(self.batch_T):
                for ranks, policy_step, write, (obs, is_init) in plan:
                    for w in ranks:
                        acquire(obs_ready[w], check)
                    write(t, policy_step(obs, is_init))
                    for w in ranks:
                        actions_ready[w].release()

    def state_dict(self) -> dict[str, Any]:
        """The workers' slices (envs and episodes) and the recurrent state of each group's policy step, kept here;
        the torch RNG the policy samples from is this process's (the trainer's ``Run`` saves it)."""
        return {"slices": self.pool.get_state(), "policy": [step.state_dict() for step in self.policy_steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_slices(state["slices"], self.pool.ranges)
        if len(state["policy"]) != len(self.policy_steps):
            raise ValueError(f"the collector state holds {len(state['policy'])} policy groups, this collector "
                             f"{len(self.policy_steps)}: build it with the same kind and policy")
        self.pool.set_state(state["slices"])
        for step, saved in zip(self.policy_steps, state["policy"], strict=True):
            step.load_state_dict(saved)

    def shutdown(self) -> None:
        self.pool.shutdown()
