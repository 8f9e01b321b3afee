"""CPU-parallel engine (rlpyt's CpuSampler): W workers, each stepping ``B/W`` envs with its own policy copy.

Each worker runs the serial loop over its slice, writing straight into a shared-memory ``[B, T]`` batch. The
workers' policy copy lives in shared memory; before every batch the main process copies the policy's parameters
and buffers into it (rlpyt's ``sync_shared_memory``). A deterministic policy gives the serial engine's batches;
stochastic ones sample from per-worker generators seeded from the collector seed (reproducible, not identical).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.policy import module_tensors
from tdrl.collect.runner import SliceSettings, allocate, check_slices
from tdrl.collect.workers import WorkerPool, get_context, worker_specs

__all__ = ["ParallelEngine"]


class ParallelEngine:
    """``n_workers`` processes (one per core is usual), each stepping ``batch_B / n_workers`` envs with a CPU copy
    of ``policy``; a dead worker or a raising env stops them all and raises :class:`CollectorError`."""

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            n_workers: int = 2, exploration: InteractionType = InteractionType.RANDOM, compile: bool = False) -> None:
        self.batch_B, self.batch_T, self.policy = batch_B, batch_T, policy
        get_context()  # a fork server (if used) starts up while we build specs and buffers
        self.worker_policy = None
        if policy is not None:
            self.worker_policy = copy.deepcopy(policy).to("cpu").share_memory()
        self.specs, step_td, self.buffer = allocate(settings, self.worker_policy, batch_B, batch_T, exploration)
        self.buffer.share_memory_()
        step_td.share_memory_()
        specs = worker_specs(settings, n_workers, step_td, self.buffer, policy=self.worker_policy,
                             exploration=exploration, compile=compile)
        self.pool = WorkerPool(specs)

    def _sync_weights(self) -> None:
        """Copy the policy's tensors into the workers' shared copy (they are idle between batches)."""
        if self.worker_policy is None:
            return
        assert self.policy is not None  # the workers' copy is made from it
        live, shared = module_tensors(self.policy), module_tensors(self.worker_policy)
        if [t.shape for t in live] != [t.shape for t in shared]:
            raise ValueError("the policy's parameters no longer match the workers' copy (shapes changed)")
        with torch.no_grad():
            for dst, src in zip(shared, live, strict=True):
                dst.copy_(src)

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        self._sync_weights()
        return self.buffer, self.pool.run_batch(("collect", exploration))

    def state_dict(self) -> dict[str, Any]:
        """Each worker's slice (envs, episodes, recurrent state) and torch RNG, which its policy samples from."""
        return {"slices": self.pool.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_slices(state["slices"], self.pool.ranges)
        self.pool.set_state(state["slices"])

    def shutdown(self) -> None:
        self.pool.shutdown()
