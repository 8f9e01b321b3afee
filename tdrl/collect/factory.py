"""``make_collector(kind, ...)``: one switch over the collector kinds, so a recipe changes one name."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.action_server import ActionServerEngine
from tdrl.collect.collector import BatchCollector
from tdrl.collect.common import active_exploration, check_batch_args, to_interaction_type
from tdrl.collect.parallel import ParallelEngine
from tdrl.collect.runner import SliceSettings
from tdrl.collect.serial import SerialEngine
from tdrl.collect.torchrl_adapter import TorchRLEngine
from tdrl.collect.workers import get_context

__all__ = [
    "COLLECTOR_KINDS",
    "ActionServerCollector",
    "ParallelCollector",
    "SerialCollector",
    "TorchRLCollector",
    "make_collector",
    "start_workers_early",
]

COLLECTOR_KINDS = ("serial", "parallel", "action_server", "alternating", "torchrl")
WORKER_KINDS = ("parallel", "action_server", "alternating")


def start_workers_early(kind: str, start_method: str | None = None) -> None:
    """Start the process tdrl's workers fork from now, for a collector of ``kind`` built later in this process.

    That fork server imports torch and tensordict once before the first worker can start; a recipe calls this
    first, so the import runs while it builds its models. The in-process kinds (``serial``, ``torchrl``) do nothing.
    """
    if kind in WORKER_KINDS:
        get_context(start_method)


def make_collector(kind: str, env_factory: Callable[..., Any], policy: TensorDictModuleBase | None = None, *,
        batch_B: int, batch_T: int, n_workers: int = 2, total_frames: int = -1, seed: int = 0,
        reset_mode: str = "reset_at_once", max_decorrelation_steps: int = 0, discount: float = 0.99,
        transform: Any = None, exploration_type: InteractionType | str | None = None,
        device: torch.device | str | None = None, return_same_td: bool = False, compile: bool = False,
        **engine_kwargs: Any) -> BatchCollector:
    """A :class:`~tdrl.collect.collector.BatchCollector` of ``kind`` yielding ``[batch_B, batch_T]`` TensorDicts.

    Args:
        kind: one of :data:`COLLECTOR_KINDS`: ``serial`` (this process), ``parallel`` (``n_workers`` processes
            each with a policy copy), ``action_server`` (workers step envs, this process acts once per step on the
            policy's device), ``alternating`` (two action-server worker groups), ``torchrl`` (TorchRL's own
            ``Collector``/``MultiSyncCollector``).
        env_factory: picklable callable returning one gymnasium env (:class:`tdrl.envs.EnvFactory`).
        policy: TorchRL policy module reading ``observation`` and writing ``action`` (and whatever else, all
            stored); a policy implementing :class:`tdrl.models.acting.Acting` is called on tensors. ``None``
            takes random actions.
        batch_B: envs (rlpyt's ``batch_B``, the first batch dim).
        batch_T: time steps per batch (rlpyt's ``batch_T``, the second batch dim).
        n_workers: worker processes of the worker kinds (ignored by ``serial``); must divide ``batch_B``.
        total_frames: iteration stops once this many frames were yielded (``-1``: never).
        seed: env ``i`` gets an independent stream (:func:`tdrl.collect.stepping.env_seed`).
        reset_mode: ``"reset_at_once"`` (auto-reset) or ``"wait_reset"`` (finished envs idle until the batch
            ends; their steps are zeros with ``("collector", "mask")`` False).
        max_decorrelation_steps: up to this many random steps per env at start-up (not batch data).
        discount: discount of the TrajInfo ``DiscountedReturn``.
        transform: TorchRL ``Transform`` applied batched where the envs are stepped (:mod:`tdrl.collect.transforms`).
        exploration_type: see :class:`~tdrl.collect.collector.BatchCollector` (``torchrl``: fixed, RANDOM default).
        device: device of the yielded batches.
        return_same_td: yield the internal buffer itself (no copy; overwritten by the next batch).
        compile: ``torch.compile`` the policy's ``act`` (tdrl kinds).
        **engine_kwargs: the tdrl engine's own options (``start_timeout``, ``start_method``, ``spin_s``).

    Raises:
        ValueError: unknown kind (the message lists the known ones) or bad batch arguments.
    """
    if kind not in COLLECTOR_KINDS:
        raise ValueError(f"unknown collector kind {kind!r}; choose one of {', '.join(COLLECTOR_KINDS)}")
    n_procs = 1 if kind == "serial" else n_workers * (2 if kind == "alternating" else 1)
    check_batch_args(batch_B, batch_T, reset_mode, n_procs)
    settings = SliceSettings(env_factory, seed, reset_mode == "wait_reset", max_decorrelation_steps, discount,
                             transform)
    shape = dict(batch_B=batch_B, batch_T=batch_T)
    if kind == "torchrl":
        exploration = to_interaction_type(exploration_type, InteractionType.RANDOM)
        engine: Any = TorchRLEngine(settings, policy, n_workers=n_workers, exploration=exploration, device=device,
                                    **shape)  # the tdrl engines' own options do not apply
        return _collector(engine, total_frames=total_frames, exploration_type=exploration, device=device,
                          return_same_td=True)  # TorchRL's batches are fresh ones
    exploration = active_exploration(exploration_type)
    if kind == "serial":
        engine = SerialEngine(settings, policy, exploration=exploration, compile=compile, **shape, **engine_kwargs)
    elif kind == "parallel":
        engine = ParallelEngine(settings, policy, n_workers=n_workers, exploration=exploration, compile=compile,
                                **shape, **engine_kwargs)
    else:
        engine = ActionServerEngine(settings, policy, n_workers=n_workers, alternating=kind == "alternating",
                                    exploration=exploration, compile=compile, **shape, **engine_kwargs)
    return _collector(engine, total_frames=total_frames, exploration_type=exploration_type, device=device,
                      return_same_td=return_same_td)


def _collector(engine: Any, **kwargs: Any) -> BatchCollector:
    try:
        return BatchCollector(engine, **kwargs)
    except BaseException:  # bad total_frames or exploration_type: stop the engine's workers
        engine.shutdown()
        raise


SerialCollector = functools.partial(make_collector, "serial")
ParallelCollector = functools.partial(make_collector, "parallel")
ActionServerCollector = functools.partial(make_collector, "action_server")
TorchRLCollector = functools.partial(make_collector, "torchrl")
