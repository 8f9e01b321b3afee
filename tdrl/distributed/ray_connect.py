"""Reaching a Ray cluster: ``trainer.ray_address`` (else ``RAY_ADDRESS``) checked in seconds, then joined, or a Ray of
the run's own started on this machine."""

from __future__ import annotations

import math
import os
import socket

from tdrl.config import check_ray_address
from tdrl.distributed.ray_actors import RayTrainerError
from tdrl.utils.console import ray_init_options, ray_output_to_run_log
from tdrl.utils.errors import UserError
from tdrl.utils.interrupt import keeps_signal_handlers

__all__ = ["RayUnreachableError", "check_reachable", "connect_ray", "ray_target"]


def connect_ray(address: str | None, *, cpus_wanted: float) -> bool:
    """Join the cluster at ``address`` (else ``RAY_ADDRESS``), or start Ray on this machine with enough CPUs for
    every actor. Returns whether Ray was started here (so the run shuts it down). In a recipe, what ``ray.init``
    prints goes to the run's ``debug.log`` and the actors' output stays in Ray's logs (:mod:`tdrl.utils.console`)."""
    try:
        import ray
    except ImportError:
        raise RayTrainerError("trainer.kind=ray needs Ray: pip install 'tdrl[distributed]'") from None
    if ray.is_initialized():
        return False
    place = ray_target(address)
    target = place[0] if place else None
    if place:
        check_reachable(*place)
    try:
        with keeps_signal_handlers(), ray_output_to_run_log():
            if target:
                ray.init(address=target, **ray_init_options())
                return False
            # "local": a new Ray of this run's own, even where another runs on this machine (ray.init() would join it)
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_wanted)),
                     include_dashboard=False, **ray_init_options())
            return True
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = f"the Ray cluster at {target}" if target else "a local Ray instance"
        raise RayTrainerError(f"cannot start or reach {where}: {str(error).splitlines()[0]}") from None


class RayUnreachableError(RayTrainerError, UserError):
    """The Ray cluster named by ``trainer.ray_address`` (or ``RAY_ADDRESS``) does not answer."""


def ray_target(address: str | None) -> tuple[str, str] | None:
    """``(address, where it came from)``: ``address`` (``trainer.ray_address``), else the ``RAY_ADDRESS``
    environment variable; ``None`` when neither is set (Ray starts on this machine)."""
    if address:
        return address, "trainer.ray_address"
    if from_env := os.environ.get("RAY_ADDRESS"):
        return from_env, "RAY_ADDRESS"
    return None


def check_reachable(address: str, source: str = "trainer.ray_address", timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when ``address`` is not ``host:port`` or nothing listens there (``ray.init``
    retries for minutes), naming ``source``, the setting the address came from (:func:`ray_target`). Addresses Ray
    resolves itself (``auto``, ``local``, ``ray://...``) are left to it."""
    check_ray_address(address, source)
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        remedy = "unset RAY_ADDRESS" if source == "RAY_ADDRESS" else "leave the address empty"
        raise RayUnreachableError(f"{source}={address}: no Ray cluster answers there ({error}); start one with "
                                  f"`ray start --head` or {remedy} for a local Ray") from None
