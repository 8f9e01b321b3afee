"""CPU-parallel collector (rlpyt's CpuSampler): W workers, each stepping ``B/W`` envs with its own policy copy.

Each worker runs the same loop as :class:`~tdrl.collect.SerialCollector` over its slice and writes straight into
a preallocated shared-memory ``[B, T]`` TensorDict; the main process only hands out one command per batch and
collects the finished episodes. Before every batch the main process copies the policy's parameters and buffers into
shared memory if they changed in place (optimizer steps, ``load_state_dict``: checked through tensor version
counters; rlpyt's ``sync_shared_memory``) and workers load them when they changed, so weights updated by the
trainer are used from the next batch on. ``update_policy_weights_()`` forces the copy (call it if you replaced
parameter tensors instead of updating them, or to pass explicit weights).

Same seed + deterministic policy ⇒ the same batches as the serial collector (per-env seeds do not depend on
which worker steps the env). Stochastic policies sample from a per-worker torch generator seeded from the
collector seed, so they are reproducible run to run but differ from the serial collector's samples.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.batch import allocate_batch
from tdrl.collect.common import (
    BufferedCollector,
    FrameBudget,
    active_exploration,
    check_batch_args,
    env_specs,
    game_score_of,
    load_weights,
    random_action_template,
    sorted_infos,
    to_interaction_type,
)
from tdrl.collect.policy import PolicyStep, module_tensors
from tdrl.collect.runner import OBS_KEYS
from tdrl.collect.stepping import make_step_td
from tdrl.collect.traj_info import unpack_entries
from tdrl.collect.workers import WorkerPool, WorkerSpec, get_context

__all__ = ["ParallelCollector"]


class ParallelCollector(BufferedCollector):
    """``[batch_B, batch_T]`` batches from ``n_workers`` processes, each with ``batch_B / n_workers`` envs.

    rlpyt's ``samples[t, b]`` (``batch_T`` × ``batch_B``) is ``batch[b, t]`` here (time last, TorchRL's layout).
    Arguments and attributes are those of :class:`~tdrl.collect.SerialCollector` (``transform`` runs in each
    worker over its envs, with its own state), plus:

    Args:
        n_workers: worker processes (one per core is the usual choice); must divide ``batch_B``.
        start_timeout: seconds allowed for the workers to build their envs.
        start_method: ``"forkserver"`` (default where available: fast start-up after the first collector) or
            ``"spawn"``; see :func:`tdrl.collect.workers.get_context`.

    Raises:
        CollectorError: a worker died or an env raised; the message names the worker and includes the
            worker's traceback. The collector is shut down before the error propagates.
    """

    def __init__(
        self,
        env_factory: Callable[..., Any],
        policy: TensorDictModuleBase | None = None,
        *,
        batch_B: int,
        batch_T: int,
        n_workers: int = 2,
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
    ) -> None:
        check_batch_args(batch_B, batch_T, reset_mode, n_workers)
        self.batch_B, self.batch_T, self.n_workers = batch_B, batch_T, n_workers
        self.budget = FrameBudget(total_frames, batch_B * batch_T)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.return_same_td = return_same_td
        self.policy = policy
        self.traj_infos: list[dict[str, float]] = []
        self._exploration_arg = to_interaction_type(exploration_type, None)
        self._exploration = active_exploration(self._exploration_arg)
        self._pool: WorkerPool | None = None
        get_context(start_method)  # a fork server (if used) starts up while we build specs and buffers
        specs = env_specs(env_factory)
        self.specs = specs
        self.step_td = make_step_td(batch_B, specs.observation_spec, transform)
        worker_policy = None
        if policy is not None:
            worker_policy = copy.deepcopy(policy).to("cpu")
            template = PolicyStep(
                worker_policy, self.step_td.select(*OBS_KEYS).clone(), exploration_type=self._exploration
            ).out_template
            self._weights = [t.detach().clone().share_memory_() for t in module_tensors(worker_policy)]
            self._bind_weights()
        else:
            template = random_action_template(specs, batch_B)
            self._weights = None
        self.buffer = allocate_batch(batch_B, batch_T, self.step_td, template).share_memory_()
        self.step_td.share_memory_()
        self._version = 0
        per = batch_B // n_workers
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
                policy=worker_policy,
                shared_weights=self._weights,
                exploration_type=self._exploration,
                fast_policy=fast_policy,
            )
            for w in range(n_workers)
        ]
        self._pool = WorkerPool(worker_specs, start_timeout=start_timeout, start_method=start_method)

    def _bind_weights(self) -> None:
        """(Re)read the policy's parameter and buffer tensors (after they were replaced, not updated in place)."""
        self._live = module_tensors(self.policy)
        if [t.shape for t in self._live] != [t.shape for t in self._weights]:
            raise ValueError("the policy's parameters no longer match the workers' copy (shapes changed)")
        self._signature: list[int] | None = None

    def _sync_weights(self, force: bool = False) -> None:
        """Copy the policy's tensors into shared memory if any changed in place since the last copy.

        In-place updates (optimizer steps, ``load_state_dict``) bump tensor version counters, so checking them
        costs ~1 µs per tensor instead of a full copy every batch.
        """
        if self._weights is None:
            return
        signature = [t._version for t in self._live]
        if force or signature != self._signature:
            with torch.no_grad():
                for shared, live in zip(self._weights, self._live, strict=True):
                    shared.copy_(live)
            self._signature = signature
            self._version += 1

    def collect(self) -> TensorDictBase:
        """Collect one batch in the workers (weights synced first); sets :attr:`traj_infos`."""
        pool = self._pool
        if pool is None or pool._closed:
            raise RuntimeError("collector is shut down")
        try:
            self._sync_weights()
            pool.send(("collect", self._version, active_exploration(self._exploration_arg)))
            replies = pool.gather("done")
        except BaseException:
            # Interrupted mid-batch (Ctrl-C, a worker failure): workers and main are out of step; stop them.
            self.shutdown()
            raise
        self.traj_infos = sorted_infos([entry for reply in replies for entry in unpack_entries(reply[1])])
        self.budget.count()
        return self._yielded_batch()

    def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """Copy the policy's weights (or the given ones, loaded into the policy first) to the workers.

        Weights are synced before every batch anyway; this makes the copy explicit (TorchRL's protocol).
        """
        if self.policy is None:
            return
        if policy_or_weights is not None and policy_or_weights is not self.policy:
            load_weights(self.policy, policy_or_weights)
        self._bind_weights()
        self._sync_weights(force=True)

    @property
    def worker_pids(self) -> list[int]:
        return list(self._pool.pids) if self._pool is not None else []

    def shutdown(self) -> None:
        """Stop the workers (graceful, then terminate/kill); safe to call more than once."""
        if self._pool is not None:
            self._pool.shutdown()

    def __repr__(self) -> str:
        return (
            f"ParallelCollector(batch_B={self.batch_B}, batch_T={self.batch_T}, n_workers={self.n_workers}, "
            f"frames={self.frames})"
        )
