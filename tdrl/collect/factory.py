"""``make_collector(kind, ...)``: one switch over the collector kinds, so a recipe changes one name.

Every kind is also constructible directly with explicit keyword arguments; this function only forwards them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict.nn import TensorDictModuleBase

from tdrl.collect.action_server import ActionServerCollector
from tdrl.collect.parallel import ParallelCollector
from tdrl.collect.serial import SerialCollector
from tdrl.collect.torchrl_adapter import TorchRLCollector
from tdrl.collect.workers import get_context

__all__ = ["COLLECTOR_KINDS", "make_collector", "start_workers_early"]

COLLECTOR_KINDS = ("serial", "parallel", "action_server", "alternating", "torchrl")
WORKER_KINDS = ("parallel", "action_server", "alternating")


def start_workers_early(kind: str, start_method: str | None = None) -> None:
    """Start the process tdrl's workers fork from now, for a collector of ``kind`` built later in this process.

    That fork server imports torch and tensordict once (2.5-5 s on 2 cores) before the first worker can start. A
    recipe calls this first, so the import runs while it builds its models and opens the run (W&B) instead of
    after; the in-process kinds (``serial``, ``torchrl``) do nothing.
    """
    if kind in WORKER_KINDS:
        get_context(start_method)


def make_collector(
    kind: str,
    env_factory: Callable[..., Any],
    policy: TensorDictModuleBase | None = None,
    *,
    batch_B: int,
    batch_T: int,
    **kwargs: Any,
) -> Any:
    """Build a collector of ``kind`` yielding ``[batch_B, batch_T]`` TensorDicts.

    Args:
        kind: one of :data:`COLLECTOR_KINDS`: ``serial`` (:class:`SerialCollector`), ``parallel``
            (:class:`ParallelCollector`), ``action_server`` and ``alternating`` (:class:`ActionServerCollector`,
            ``alternating=True`` for the latter), ``torchrl`` (:class:`TorchRLCollector`).
        env_factory: picklable env constructor (:class:`tdrl.envs.EnvFactory`).
        policy: TorchRL policy module, or ``None`` for random actions.
        batch_B: envs (rlpyt's ``batch_B``, the first batch dim).
        batch_T: time steps per batch (rlpyt's ``batch_T``, the second batch dim).
        **kwargs: the chosen class's keyword arguments (``seed``, ``total_frames``, ``reset_mode``,
            ``max_decorrelation_steps``, ``discount``, ``transform``, ``exploration_type``, ``device``,
            ``n_workers``...). ``n_workers`` is ignored by ``serial``; tdrl-only knobs are ignored by ``torchrl``.

    Raises:
        ValueError: unknown kind (the message lists the known ones).
    """
    if kind == "serial":
        kwargs.pop("n_workers", None)  # one process; accepted so recipes can switch kinds by name only
        return SerialCollector(env_factory, policy, batch_B=batch_B, batch_T=batch_T, **kwargs)
    if kind == "parallel":
        return ParallelCollector(env_factory, policy, batch_B=batch_B, batch_T=batch_T, **kwargs)
    if kind == "action_server":
        return ActionServerCollector(env_factory, policy, batch_B=batch_B, batch_T=batch_T, **kwargs)
    if kind == "alternating":
        return ActionServerCollector(env_factory, policy, batch_B=batch_B, batch_T=batch_T, alternating=True, **kwargs)
    if kind == "torchrl":
        for name in ("return_same_td", "fast_policy", "start_timeout", "start_method"):
            kwargs.pop(name, None)  # tdrl-only knobs
        return TorchRLCollector(env_factory, policy, batch_B=batch_B, batch_T=batch_T, **kwargs)
    raise ValueError(f"unknown collector kind {kind!r}; choose one of {', '.join(COLLECTOR_KINDS)}")
