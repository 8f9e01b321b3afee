"""``make_collector(kind, ...)``: one switch over the collector kinds, so a recipe changes one name."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.action_server import ActionServerEngine
from tdrl.collect.batched_env import BatchedEnvEngine, check_kind
from tdrl.collect.collector import BatchCollector
from tdrl.collect.common import active_exploration, check_batch_args, to_interaction_type
from tdrl.collect.parallel import ParallelEngine
from tdrl.collect.runner import SliceSettings
from tdrl.collect.serial import SerialEngine
from tdrl.collect.torchrl_adapter import TorchRLEngine
from tdrl.collect.workers import get_context

__all__ = ["COLLECTOR_KINDS", "ParallelCollector", "SerialCollector", "make_collector", "start_workers_early"]

COLLECTOR_KINDS = ("serial", "parallel", "action_server", "alternating", "torchrl", "batched_env")
WORKER_KINDS = ("parallel", "action_server", "alternating")


def start_workers_early(kind: str) -> None:
    """Start the fork server tdrl's workers fork from now, for a collector of ``kind`` built later: it imports
    torch once before the first worker can start, so a recipe calls this first and the import overlaps building
    its models. The in-process kinds (``serial``, ``torchrl``, ``batched_env``) do nothing."""
    if kind in WORKER_KINDS:
        get_context()


def make_collector(kind: str, env_factory: Callable[..., Any], policy: TensorDictModuleBase | None = None, *,
        batch_B: int, batch_T: int, n_workers: int = 2, total_frames: int = -1, seed: int = 0,
        reset_mode: str = "reset_at_once", max_decorrelation_steps: int = 0, discount: float = 0.99,
        transform: Any = None, exploration_type: InteractionType | str | None = None,
        device: torch.device | str | None = None, return_same_td: bool = False,
        compile: bool = False) -> BatchCollector:
    """A :class:`~tdrl.collect.collector.BatchCollector` of ``kind`` yielding ``[batch_B, batch_T]`` TensorDicts.

    Args:
        kind: one of :data:`COLLECTOR_KINDS` (see :mod:`tdrl.collect`).
        env_factory: picklable callable returning one gymnasium env (:class:`tdrl.envs.EnvFactory`); for
            ``batched_env``, one env object of ``batch_B`` envs (:mod:`tdrl.collect.batched_env`).
        policy: TorchRL policy module reading ``observation`` and writing ``action`` (and whatever else, all
            stored; see :mod:`tdrl.collect.policy`). ``None`` takes random actions.
        batch_B: envs (rlpyt's ``batch_B``, the first batch dim).
        batch_T: time steps per batch (rlpyt's ``batch_T``, the second batch dim).
        n_workers: worker processes (per group for ``alternating``; ignored by ``serial``); must divide ``batch_B``.
        total_frames: iteration stops once this many frames were yielded (``-1``: never).
        seed: env ``i`` gets an independent stream (:func:`tdrl.collect.stepping.env_seed`).
        reset_mode: ``"reset_at_once"`` (auto-reset) or ``"wait_reset"`` (finished envs idle until the batch
            ends; their steps are zeros with ``("collector", "mask")`` False).
        max_decorrelation_steps: up to this many random steps per env at start-up (not batch data).
        discount: discount of the TrajInfo ``DiscountedReturn``.
        transform: a TorchRL ``Transform``: appended to each env by the ``torchrl`` kind; tdrl's kinds apply it
            batched to each slice's steps where its envs step (observation and reward transforms such as
            ``VecNorm``, ``ObservationNorm``, ``RewardScaling``; see :mod:`tdrl.collect.transform`).
        exploration_type: see :class:`~tdrl.collect.collector.BatchCollector` (``torchrl``: fixed, RANDOM default).
        device: device of the yielded batches (``batched_env``: also where its env simulates, unless the env
            factory's kwargs name a ``device``).
        return_same_td: yield the internal buffer itself (no copy; overwritten by the next batch).
        compile: ``torch.compile`` the policy's ``act`` (tdrl kinds).

    Raises:
        ValueError: unknown kind (the message lists the known ones) or bad batch arguments.
        UserError: a kind that cannot step the env (:func:`~tdrl.collect.batched_env.check_kind`).
    """
    if kind not in COLLECTOR_KINDS:
        raise ValueError(f"unknown collector kind {kind!r}; choose one of {', '.join(COLLECTOR_KINDS)}")
    check_kind(kind, env_factory)
    if transform is not None and kind != "torchrl" and reset_mode != "reset_at_once":
        raise ValueError("transform= needs reset_mode='reset_at_once' in tdrl's collector kinds")
    n_procs = 1 if kind in ("serial", "batched_env") else n_workers * (2 if kind == "alternating" else 1)
    check_batch_args(batch_B, batch_T, reset_mode, n_procs)
    settings = SliceSettings(env_factory, seed, reset_mode == "wait_reset", max_decorrelation_steps, discount,
                             transform)
    if kind == "torchrl":  # TorchRL fixes the exploration type when it is built; its batches are fresh ones
        exploration = to_interaction_type(exploration_type) or InteractionType.RANDOM
        exploration_type, return_same_td = exploration, True
    else:
        exploration = active_exploration(exploration_type)
    common = dict(batch_B=batch_B, batch_T=batch_T, exploration=exploration)
    engine: Any
    if kind == "torchrl":
        engine = TorchRLEngine(settings, policy, n_workers=n_workers, device=device, **common)
    elif kind == "serial":
        engine = SerialEngine(settings, policy, compile=compile, **common)
    elif kind == "batched_env":
        engine = BatchedEnvEngine(settings, policy, device=device, compile=compile, **common)
    elif kind == "parallel":
        engine = ParallelEngine(settings, policy, n_workers=n_workers, compile=compile, **common)
    else:
        engine = ActionServerEngine(settings, policy, n_workers=n_workers, alternating=kind == "alternating",
                                    compile=compile, **common)
    try:
        # the torchrl kind appends the transform to its envs: no slice state to follow
        return BatchCollector(engine, total_frames=total_frames, exploration_type=exploration_type, device=device,
                              return_same_td=return_same_td, transform=None if kind == "torchrl" else transform)
    except BaseException:  # bad total_frames: stop the engine's workers
        engine.shutdown()
        raise


SerialCollector = functools.partial(make_collector, "serial")
ParallelCollector = functools.partial(make_collector, "parallel")
