"""``trainer.kind=ray``: collector actors anywhere in a Ray cluster, one learner here (Ape-X and IMPALA).

The recipe's loop body is the one it has for the other trainers:

- **Off-policy** (a ``replay`` is given: Ape-X): actors write their batches into the replay through the
  :class:`~tdrl.distributed.ray_actors.LearnerHub`; an iteration is one optimizer round that yields its
  ``updates_due`` (the async trainer's replay-ratio throttle, at most ``updates_per_sync``), and the loop body
  samples the replay itself. The actors run ``max_lag_frames`` at most ahead of the ratio (``None``: free, as
  the Ape-X paper's actors).
- **On-policy** (no replay: IMPALA): each iteration yields ``unrolls_per_batch`` actors' ``[B, T]`` unrolls
  concatenated on dim 0, each step tagged with the weights version it was collected with (``VERSION_KEY``);
  the recipe corrects for the lag (V-trace).

Weights are published as a new version after every ``updates_per_sync`` updates (on-policy: after every batch)
and pulled by each actor at the start of its next rollout (an Ape-X rollout, which may carry several batches, also
loads them between its batches: :data:`~tdrl.distributed.ray_actors.CALL_MIN_S`). Counters are frames of acknowledged
rollouts; ``iteration`` counts their collector batches. Log rows add per-actor frames/s, restarts, weight lag,
queue depth and bytes on the wire per frame.

Checkpoints (interval, end, and SIGTERM, which every trainer turns into a checkpoint at the next boundary, here a
round, before raising :class:`~tdrl.utils.interrupt.Interrupted`: :attr:`~tdrl.train.bookkeeping.Bookkeeper.sigterm`)
hold the learner's objects, the books, the replay (its writes paused) and the published version. A relaunch resumes
the learner, optimizer, replay and counters exactly as saved; the actors start fresh (new episodes, new env seeds per
session), and what they collect afterwards depends on timing: nothing after the checkpoint is bitwise.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from tdrl.config import RayConfig
from tdrl.distributed.actor_pool import ActorPool
from tdrl.distributed.ray_actors import (
    CollectorActor,
    LearnerHub,
    RayTrainerError,
    actor_seed,
    from_wire,
    nbytes,
    to_wire,
)
from tdrl.distributed.ray_connect import connect_ray
from tdrl.distributed.replicas import tensor_digest
from tdrl.train.async_collector import POLL_S
from tdrl.train.bookkeeping import frames_per_batch
from tdrl.train.core import TrainerCore
from tdrl.train.protocols import Evaluator, Replay, RunLog
from tdrl.train.schedule import Schedule, owed_updates
from tdrl.train.sync import shutdown
from tdrl.utils.console import ray_output_to_run_log

__all__ = ["ActorHooks", "RayTrainer", "module_path"]

if TYPE_CHECKING:  # annotations only: tdrl.collect imports torchrl.envs (~1 s)
    from tdrl.collect import Collector


def describe(digest: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in digest.items())


def module_path(root: torch.nn.Module, module: torch.nn.Module) -> str:
    """The dotted name of ``module`` inside ``root`` (``""`` for ``root`` itself)."""
    for name, candidate in root.named_modules():
        if candidate is module:
            return name
    raise ValueError(f"{type(module).__name__} is not a submodule of the policy {type(root).__name__}")


@dataclass(frozen=True)
class ActorHooks:
    """What an algorithm adds to each Ray actor (Ape-X). ``weights_module``: what is published (default: the whole
    policy), found in each actor's copy of the policy at the same path (Ape-X keeps each actor's epsilon out of
    it); ``setup(policy, index, n_actors)``: called in each actor before its first rollout as ``index``;
    ``priorities(policy, batch)``: the initial priorities each actor computes for its batches."""

    weights_module: torch.nn.Module | None = None
    setup: Callable[[Any, int, int], None] | None = None
    priorities: Callable[[Any, Any], torch.Tensor] | None = None


class RayTrainer(TrainerCore):
    """Collector actors on Ray, learner here (see the module docstring; :class:`~tdrl.train.core.TrainerCore`
    documents ``schedule``, ``run``, ``eval_collector``, ``replay``, ``checkpoint_state``, ``log_traj_window``;
    :class:`~tdrl.train.AsyncTrainer` ``updates_per_sync``, ``max_lag_frames`` and ``seed``).

    Args:
        collector_factory: picklable callable building one actor's collector; called with ``seed=``.
        policy: the learner's policy.
        ray: the actors and the cluster (:class:`tdrl.config.RayConfig`: ``n_actors``, ``spare_actors`` kept built
            to replace a dead one at once (:mod:`tdrl.distributed.actor_pool`), ``ray_address`` (empty: ``RAY_ADDRESS``,
            else a local Ray), ``actor_cpus``, ``call_timeout_s`` of every remote call).
        hooks: what the algorithm adds to each actor (:class:`ActorHooks`).
        replay: off-policy (Ape-X): the learner's replay, which the actors write into; ``None``: on-policy.
        unrolls_per_batch: on-policy: unrolls per learner batch.
    """

    def __init__(
        self,
        *,
        collector_factory: Callable[..., Collector],
        policy: torch.nn.Module,
        schedule: Schedule,
        ray: RayConfig,
        hooks: ActorHooks = ActorHooks(),
        replay: Replay | None = None,
        run: RunLog | None = None,
        eval_collector: Evaluator | None = None,
        checkpoint_state: Mapping[str, Any] | None = None,
        log_traj_window: int = 100,
        updates_per_sync: int = 1,
        max_lag_frames: int | None = 0,
        unrolls_per_batch: int = 1,
        seed: int = 0,
    ) -> None:
        self.on_policy = replay is None
        if not self.on_policy and (not schedule.replay_ratio or not schedule.batch_size):
            raise ValueError("an off-policy ray trainer throttles on replay_ratio and batch_size; pass both")
        super().__init__(schedule=schedule, frames_per_itr=frames_per_batch(collector_factory),  # one batch
                         run=run, eval_collector=eval_collector, checkpoint_state=checkpoint_state, replay=replay,
                         log_traj_window=log_traj_window,
                         update_batch_size=None if self.on_policy else schedule.batch_size)
        self.collector_factory, self.policy, self.ray, self.hooks = collector_factory, policy, ray, hooks
        self.weights_module = hooks.weights_module if hooks.weights_module is not None else policy
        self.weights_path = module_path(policy, self.weights_module)
        self.n_actors = int(ray.n_actors)
        self.updates_per_sync, self.max_lag_frames = int(updates_per_sync), max_lag_frames
        self.unrolls_per_batch = int(unrolls_per_batch)
        self.seed = seed
        self.policy_version = 0
        self.pool: ActorPool | None = None
        self._hub: Any = None
        self._started_ray = False
        self._due = 0
        self._unrolls: list[Any] = []
        self._updates_at_publish = self._weights_bytes = 0
        self._publish_ref: Any = None
        self._factory_ref: Any = None
        self._interval = self._new_interval()

    @property
    def updates_due(self) -> int:
        """Gradient updates allowed in this round (off-policy)."""
        return self._due

    def _summary_extra(self) -> dict[str, Any]:
        return {"actors": self.n_actors, "actor_restarts": self.pool.restarts if self.pool else 0,
                "actor_nodes": self.pool.nodes() if self.pool else 0}

    # --- The loop ----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self._session(self._loop)

    def _loop(self) -> Iterator[Any]:
        with self.book.paused():  # starting Ray and the actors is not training time
            self._start()
        over = self.book.itr >= self.cadence.n_itr
        while not over:
            yield from self._unroll_round() if self.on_policy else self._replay_round()
            over = self._boundary()

    def _close(self) -> None:
        self._stop()
        shutdown(self.eval_collector)

    def _replay_round(self) -> Iterator[int]:
        assert self.pool is not None  # _start() built it
        self._due = self._owed()
        self._account(self.pool.poll(timeout=0.0 if self._due else POLL_S))
        self._due = self._due or self._owed()
        if self._due:
            yield from self._body(self._due)
            if self.book.updates - self._updates_at_publish >= self.updates_per_sync:
                self._publish()

    def _unroll_round(self) -> Iterator[Any]:
        assert self.pool is not None  # _start() built it
        self._account(self.pool.poll(timeout=POLL_S))
        while len(self._unrolls) >= self.unrolls_per_batch:
            parts, self._unrolls = self._unrolls[:self.unrolls_per_batch], self._unrolls[self.unrolls_per_batch:]
            yield from self._body(torch.cat(parts, 0))
            self._publish()

    def _owed(self) -> int:
        replay = self.replay
        # off-policy: __init__ checked that they are given
        assert replay is not None and self.schedule.replay_ratio is not None and self.schedule.batch_size is not None
        owed = owed_updates(replay_ratio=self.schedule.replay_ratio, batch_size=self.schedule.batch_size,
                            write_count=replay.write_count, samples_drawn=replay.samples_drawn,
                            learn_start_frames=self.cadence.learn_start_frames, ready=replay.ready_count())
        return min(owed, self.updates_per_sync)

    def _account(self, reports: list[Any]) -> None:
        iv = self._interval
        for report in reports:
            if not report.frames:  # an Ape-X call whose write is still pending: nothing reached the replay yet
                continue
            self.book.frames += report.frames
            self.book.itr += report.batches
            self.book.add_episodes(report.trajs)
            lag = self.policy_version - report.version
            iv["lag_sum"] += lag
            iv["lag_max"] = max(iv["lag_max"], lag)
            iv["rollouts"] += 1
            iv["wire_bytes"] += report.wire_bytes
            iv["frames"] += report.frames
            iv["frames_max"] = max(iv["frames_max"], report.frames)
            if report.batch is not None:
                self._unrolls.append(from_wire(report.batch))
        assert self.pool is not None  # the reports came from it
        self.pool.print_events()

    # --- Actors, weights, observability ------------------------------------------------------------------------

    def _start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray_cfg = self.ray
        self._started_ray = connect_ray(ray_cfg.ray_address or None, cpus_wanted=self.n_actors * ray_cfg.actor_cpus)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._hub = ray.remote(LearnerHub).options(num_cpus=0, max_concurrency=8, scheduling_strategy=here).remote(
            self.replay, replay_ratio=self.schedule.replay_ratio, batch_size=self.schedule.batch_size,
            learn_start_frames=self.cadence.learn_start_frames, max_lag_frames=self.max_lag_frames)
        self._publish()
        # SPREAD over the nodes: Ray's default packs actors onto the driver's node while it has room
        options = {"max_restarts": -1, "max_task_retries": 0, "scheduling_strategy": "SPREAD"}
        actor_class = ray.remote(CollectorActor)
        # a spare reserves no CPU: it idles until it replaces an actor, which frees its own
        working, spare_class = (actor_class.options(num_cpus=cpus, **options) for cpus in (ray_cfg.actor_cpus, 0))
        seed = self.seed + self.book.itr  # a resumed session: fresh env streams
        # held here for the whole run, so a restarted actor finds its factory (ray#53727); passed in a list, so
        # each actor fetches it itself and its constructor's own arguments stay small
        self._factory_ref = ray.put(self.collector_factory)

        def make_actor(number: int, spare: bool) -> Any:
            return (spare_class if spare else working).remote(
                self.n_actors, [self._factory_ref], actor_seed(seed, number), weights_path=self.weights_path,
                hub=self._hub, setup=self.hooks.setup, priorities=self.hooks.priorities,
                call_timeout_s=ray_cfg.call_timeout_s)

        # Ray logs an error for the first actor built with a reference among its arguments, which a restart needs:
        # harmless here (both are held above for the whole run), so in a recipe it goes to the run's debug.log
        with ray_output_to_run_log():
            self.pool = ActorPool(make_actor, self.n_actors, mode="unroll" if self.on_policy else "replay",
                                  spares=ray_cfg.spare_actors, call_timeout_s=ray_cfg.call_timeout_s)

    def _publish(self) -> None:
        """Put the learner's weights in the object store as the next version and hand the hub its reference."""
        import ray

        if self._publish_ref is not None:  # one publish in flight at a time
            ray.get(self._publish_ref, timeout=self.ray.call_timeout_s)
        self.policy_version += 1
        weights = TensorDict.from_module(self.weights_module).data.to("cpu")
        self._publish_ref = self._hub.publish.remote(self.policy_version, [ray.put(to_wire(weights))])
        self._weights_bytes = nbytes(weights)
        self._updates_at_publish = self.book.updates

    def _stop(self) -> None:
        if self._hub is None:
            return
        import ray

        with contextlib.suppress(Exception):
            if self.pool is not None:
                self.pool.print_events()
                self.pool.shutdown(timeout=self.ray.call_timeout_s / 4)
        with contextlib.suppress(Exception):
            ray.kill(self._hub, no_restart=True)
        self._hub = None
        if self._started_ray:
            ray.shutdown()

    @staticmethod
    def _new_interval() -> dict[str, float]:
        return {"lag_sum": 0.0, "lag_max": 0.0, "rollouts": 0, "wire_bytes": 0, "frames": 0, "frames_max": 0}

    def _row_extra(self) -> dict[str, float]:
        iv, self._interval = self._interval, self._new_interval()
        extra = {"actors/weight_version": float(self.policy_version)}
        if self.pool is None:
            return extra
        in_flight = sum(len(s.pending) for s in self.pool.slots)
        extra.update({
            "actors/restarts": float(self.pool.restarts),
            "actors/weight_lag_mean": iv["lag_sum"] / max(iv["rollouts"], 1),
            "actors/weight_lag_max": iv["lag_max"],
            "actors/queue_depth": float(len(self._unrolls) if self.on_policy else 0),
            "actors/in_flight": float(in_flight),
            "actors/rollout_frames_max": float(iv["frames_max"]),
            "ray/wire_bytes_per_frame": iv["wire_bytes"] / max(iv["frames"], 1),
            # a bound on what the run holds in Ray's object store (Ray inlines small objects)
            "ray/bytes_in_flight": self._weights_bytes + in_flight * iv["wire_bytes"] / max(iv["rollouts"], 1),
        })
        for i, fps in enumerate(self.pool.take_fps()):
            extra[f"actors/fps_{i}"] = fps
        if not self.on_policy:
            assert self.replay is not None  # off-policy
            samples, writes = self.replay.samples_drawn, self.replay.write_count
            learned = writes - self.cadence.learn_start_frames
            extra.update({"replay/ratio": samples / learned if learned > 0 else 0.0,
                          "replay/writes": float(writes), "replay/samples": float(samples)})
        return extra

    def _digest(self) -> dict[str, Any]:
        """What a resume must restore exactly: counters, replay size and priority sum, the learner's parameters."""
        modules = [obj for obj in self.objects.states.values() if isinstance(obj, torch.nn.Module)]
        sampler = getattr(self.replay, "sampler", None)
        return {"frames": self.book.frames, "updates": self.book.updates,
                "replay_size": len(self.replay) if self.replay is not None else 0,
                "priority_sum": round(sampler.total, 6) if sampler is not None else None,
                "parameters_sha256": tensor_digest(p for m in modules for p in m.parameters())[:16]}

    # --- Checkpoints -------------------------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        import ray

        if self.replay is not None:
            ray.get(self._hub.pause.remote(), timeout=self.ray.call_timeout_s)  # the replay holds still while saved
        try:
            super()._save_checkpoint()
        finally:
            if self.replay is not None:
                ray.get(self._hub.resume.remote(), timeout=self.ray.call_timeout_s)

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {"policy_version": self.policy_version, "digest": self._digest()}

    def _restore(self, state: Mapping[str, Any]) -> None:
        self.policy_version = int(state["policy_version"])
        restored = self._digest()
        if restored != state["digest"]:
            raise RayTrainerError(f"the restored learner differs from its checkpoint: {restored} != {state['digest']}")
        print(f"tdrl: resumed {describe(restored)} (equal to the checkpoint's)", file=sys.stderr, flush=True)
