"""CPU-parallel engine (rlpyt's CpuSampler): W workers, each stepping ``B/W`` envs with its own policy copy.

Each worker runs the serial loop over its slice and writes straight into a shared-memory ``[B, T]`` batch; the
main process hands out one command per batch and collects the finished episodes. The workers' policy copy lives
in shared memory: before every batch the main process copies the policy's parameters and buffers into it (rlpyt's
``sync_shared_memory``), so weights updated by the trainer are used from the next batch on.

Same seed + deterministic policy => the same batches as the serial engine (per-env seeds do not depend on which
worker steps the env). Stochastic policies sample from a per-worker torch generator seeded from the collector
seed: reproducible run to run, but not the serial engine's samples.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.policy import module_tensors
from tdrl.collect.runner import SliceSettings, allocate
from tdrl.collect.workers import WorkerPool, get_context, worker_specs

__all__ = ["ParallelEngine"]


class ParallelEngine:
    """``n_workers`` processes, each stepping ``batch_B / n_workers`` envs with a CPU copy of ``policy``.

    Args:
        n_workers: worker processes (one per core is the usual choice); must divide ``batch_B``.
        start_timeout: seconds allowed for the workers to build their envs.
        start_method: ``"forkserver"`` (default where available) or ``"spawn"``
            (:func:`tdrl.collect.workers.get_context`).

    Raises:
        CollectorError: a worker died or an env raised; the message names the worker and carries its traceback.
            The workers are stopped before the error propagates.
    """

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            n_workers: int = 2, exploration: InteractionType = InteractionType.RANDOM, compile: bool = False,
            start_timeout: float = 120.0, start_method: str | None = None) -> None:
        self.transform = None  # applied where the envs are stepped, with its own state there
        self.batch_B, self.batch_T, self.n_workers, self.policy = batch_B, batch_T, n_workers, policy
        get_context(start_method)  # a fork server (if used) starts up while we build specs and buffers
        self.worker_policy = None
        if policy is not None:
            self.worker_policy = copy.deepcopy(policy).to("cpu").share_memory()
        self.specs, step_td, self.buffer = allocate(settings, self.worker_policy, batch_B, batch_T, exploration)
        self.buffer.share_memory_()
        step_td.share_memory_()
        specs = worker_specs(settings, n_workers, step_td, self.buffer, policy=self.worker_policy,
                             exploration=exploration, compile=compile)
        self.pool = WorkerPool(specs, start_timeout=start_timeout, start_method=start_method)

    def _sync_weights(self) -> None:
        """Copy the policy's tensors into the workers' shared copy (they are idle between batches)."""
        if self.worker_policy is None:
            return
        live, shared = module_tensors(self.policy), module_tensors(self.worker_policy)
        if [t.shape for t in live] != [t.shape for t in shared]:
            raise ValueError("the policy's parameters no longer match the workers' copy (shapes changed)")
        with torch.no_grad():
            for dst, src in zip(shared, live, strict=True):
                dst.copy_(src)

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        self._sync_weights()
        return self.buffer, self.pool.run_batch(("collect", exploration))

    def shutdown(self) -> None:
        self.pool.shutdown()
