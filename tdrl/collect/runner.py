"""One slice of a collector: envs ``[lo, hi)`` stepping in this process and, optionally, the policy.

The serial collector runs one :class:`SliceRunner` over all envs; the parallel collector runs one per worker
process over its ``B/W`` envs, writing into a shared-memory batch. The action-server workers run only the env
half of it (:meth:`SliceRunner.served_batch`), receiving actions from the main process step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.batch import ColumnWriter, finish_slice
from tdrl.collect.common import PolicyWriter
from tdrl.collect.policy import PolicyStep
from tdrl.collect.stepping import STEP_NEXT_KEYS, EnvSlice

__all__ = ["SliceRunner", "OBS_KEYS"]

OBS_KEYS = ["observation", "is_init"]
Entries = list[tuple[int, int, dict[str, float]]]


class SliceRunner:
    """Collects rows ``lo:hi`` of a ``[B, T]`` batch.

    Args:
        env_factory: env constructor.
        lo, hi: env rows owned (global indices).
        step_td: ``[B]`` step TensorDict (shared when several processes use it).
        batch: ``[B, T]`` batch buffer (shared likewise).
        policy: policy run here (a private copy in workers), or ``None`` (random actions, or actions written
            into the batch by an action server).
        seed, wait_reset, discount, game_score, max_decorrelation_steps: see :class:`SerialCollector`.
        exploration_type: exploration type of ``policy``.
        fast_policy: allow the compiled policy path.
        transform: TorchRL transform applied batched over this slice after every step.
    """

    def __init__(
        self,
        env_factory: Callable[..., Any],
        lo: int,
        hi: int,
        step_td: TensorDictBase,
        batch: TensorDictBase,
        policy: TensorDictModuleBase | None,
        *,
        seed: int,
        wait_reset: bool,
        discount: float,
        game_score: bool,
        max_decorrelation_steps: int,
        exploration_type: InteractionType = InteractionType.RANDOM,
        fast_policy: bool = True,
        transform: Any = None,
    ) -> None:
        self.lo, self.hi = lo, hi
        self.batch = batch
        self.n_total = int(batch.batch_size[0])
        self.batch_T = int(batch.batch_size[1])
        self.wait_reset = wait_reset
        self.envs = EnvSlice(
            env_factory,
            range(lo, hi),
            step_td,
            seed=seed,
            wait_reset=wait_reset,
            batch_T=self.batch_T,
            discount=discount,
            game_score=game_score,
            transform=transform,
        )
        try:
            self.envs.start(max_decorrelation_steps)
            rows = step_td[lo:hi]
            self.obs = rows.get("observation")
            self.is_init = rows.get("is_init")
            self.policy_step = (
                PolicyStep(
                    policy,
                    rows.select(*OBS_KEYS).clone(),
                    exploration_type=exploration_type,
                    fast=fast_policy,
                    env_offset=lo,
                )
                if policy is not None
                else None
            )
        except BaseException:
            self.envs.close()
            raise
        self.write_obs = ColumnWriter(batch, OBS_KEYS, step_td, lo, hi)
        self.write_next = ColumnWriter(batch, list(STEP_NEXT_KEYS), step_td, lo, hi)
        self.write_policy = (
            PolicyWriter(batch, list(self.policy_step.out_template.keys(True, True)), lo, hi)
            if self.policy_step is not None
            else None
        )
        self.actions = batch.get("action").numpy()[lo:hi]

    def run_batch(self) -> Entries:
        """Collect ``T`` steps of this slice (policy here or random actions); returns finished episodes."""
        envs, policy_step, actions = self.envs, self.policy_step, self.actions
        write_obs, write_next, write_policy = self.write_obs, self.write_next, self.write_policy
        obs, is_init = self.obs, self.is_init
        with policy_step.running() if policy_step is not None else nullcontext():
            for t in range(self.batch_T):
                write_obs(t)
                if policy_step is not None:
                    write_policy(t, policy_step(obs, is_init))
                else:
                    envs.sample_actions(actions[:, t])
                envs.step(t, actions[:, t])
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
            write_obs(t)  # while the server computes actions from the same (read-only) step arrays
            wait(actions_ready)
            envs.step(t, actions[:, t])
            if t < last:
                obs_ready.release()
            write_next(t)
        return self.end_batch()

    def end_batch(self) -> Entries:
        envs = self.envs
        valid = envs.valid_mask()
        entries = envs.batch_traj_infos(valid if self.wait_reset else None)
        finish_slice(self.batch, self.lo, self.hi, valid, envs.traj_ids(self.n_total), self.wait_reset)
        return entries

    def finish_batch(self) -> None:
        """Wait-reset: reset finished envs (workers do it after replying, while the trainer is busy)."""
        self.envs.finish_batch()

    def close(self) -> None:
        self.envs.close()
