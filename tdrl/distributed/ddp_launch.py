"""Starting the ranks of a data-parallel run: local spawn, or joining torchrun's / SLURM's process group.

A rank that raises or dies stops the others (torch's spawn context: SIGTERM after a 5 s grace period, then
SIGKILL) and the launcher raises :class:`DataParallelError` with that rank's traceback; ranks also exit when the
launching process disappears.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessException

from tdrl.utils.distributed import (
    DistributedSetupError,
    check_local_world_size,
    env_world,
    free_port,
    init_from_env,
    is_distributed,
    resolve_backend,
)
from tdrl.utils.interrupt import ignore_sigint
from tdrl.utils.process import watch_parent
from tdrl.utils.scripts import load_module

__all__ = ["DataParallelError", "check_data_parallel", "launch_data_parallel"]


class DataParallelError(RuntimeError):
    """A rank of a data-parallel run failed; the message carries its rank and traceback."""


def check_data_parallel(world_size: int, backend: str, device: str | torch.device = "cpu") -> None:
    """Raise ``DistributedSetupError`` for a ``trainer.world_size`` or ``trainer.backend`` this machine cannot run
    (NCCL without CUDA, more local ranks than cores or GPUs), before any process starts. Under torchrun or SLURM the
    launcher has placed the ranks, so only the backend is checked; inside a process group, nothing."""
    if world_size < 1:
        raise DistributedSetupError(f"trainer.world_size must be >= 1, got {world_size}")
    if is_distributed():
        return
    resolved = resolve_backend(backend, device, key="trainer.backend")
    if env_world() is None:  # a local spawn
        check_local_world_size(world_size, resolved, key="trainer.world_size")


def launch_data_parallel(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int,
    backend: str = "auto",
    device: str | torch.device = "cpu",
    timeout_s: float = 1800.0,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` (a picklable, module-level function) on ``world_size`` ranks; rank 0's result.

    Inside an initialised process group it just calls ``fn`` (a rank calling the recipe's ``main`` again); with
    torch's ``env://`` variables set (torchrun, or a SLURM job launched by ``tdrl.launch``) it joins that group,
    whose ``WORLD_SIZE`` must equal ``world_size``; otherwise it spawns the ranks (``world_size == 1`` runs here).
    ``backend``: ``auto`` (NCCL for CUDA devices, else gloo), ``gloo`` or ``nccl``; ``device``: the learner device
    (each rank gets ``cuda:<local rank>``); ``timeout_s``: how long a collective waits for a slow or dead rank.
    Raises ``DistributedSetupError`` (bad world size, NCCL without CUDA, more ranks than cores/GPUs) before any
    process starts, and :class:`DataParallelError` with the traceback of the rank that failed.
    """
    if is_distributed():
        return fn(*args, **kwargs)
    env = env_world()
    if env is not None:
        if env[1] != world_size:
            raise DistributedSetupError(f"world_size={world_size} but the launcher started WORLD_SIZE={env[1]} ranks; "
                                        "make them agree")
        init_from_env(backend, device, timeout_s)
        try:
            return fn(*args, **kwargs)
        finally:
            dist.destroy_process_group()
    backend = resolve_backend(backend, device)
    check_local_world_size(world_size, backend)
    port = free_port()
    call = _pack_call(fn, args, kwargs)
    if world_size == 1:
        return _run_rank(0, call, 1, backend, port, timeout_s, None)
    return _spawn_ranks(call, world_size, backend, port, timeout_s)


def _spawn_ranks(call: tuple[str, str | None, bytes], world_size: int, backend: str, port: int,
                 timeout_s: float) -> Any:
    """Run ``call`` on ``world_size`` spawned ranks until all exit; rank 0's result, or the first failure raised."""
    with tempfile.TemporaryDirectory(prefix="tdrl-ddp-") as tmp:
        result_path = os.path.join(tmp, "result.pt")
        context = torch.multiprocessing.start_processes(
            _run_rank, args=(call, world_size, backend, port, timeout_s, result_path),
            nprocs=world_size, join=False, start_method="spawn",
        )
        try:
            while not context.join(grace_period=5.0):
                pass
        except ProcessException as e:
            raise DataParallelError(_failure_report(tmp, e, world_size)) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(5.0)
            for path in context.error_files:
                if os.path.exists(path):
                    os.unlink(path)
        return torch.load(result_path, weights_only=False) if os.path.exists(result_path) else None


def _write_failure(directory: str, rank: int, trace: str) -> None:
    path = os.path.join(directory, f"failure_rank{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump((time.time(), trace), f)
    os.replace(path + ".tmp", path)


def _failure_report(directory: str, error: ProcessException, world: int) -> str:
    """Name the rank that failed first, with its traceback.

    When one rank raises, its peers usually fail a moment later inside a collective ("Connection reset by
    peer"), and torch reports whichever exit it noticed first. Each rank stamps its failure time before its
    connections close, so the earliest stamp is the root cause.
    """
    failures = []
    for index in range(world):
        path = os.path.join(directory, f"failure_rank{index}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                stamp, trace = pickle.load(f)
            failures.append((stamp, index, trace))
    if not failures:  # killed by a signal: no traceback
        return (f"rank {error.error_index} of {world} failed (pid {error.error_pid}); the other ranks were stopped. "
                f"{error}")
    failures.sort()
    _, first, trace = failures[0]
    later = [index for _, index, _ in failures[1:]]
    also = f" (rank(s) {later} failed after it, waiting on the failed peer)" if later else ""
    return f"rank {first} of {world} failed{also}; the other ranks were stopped. Rank {first}'s error:\n{trace}"


def _pack_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[str, str | None, bytes]:
    """``fn(*args, **kwargs)`` pickled, with the file of ``fn``'s module: recipes are scripts loaded by path under
    made-up module names, which a spawned rank cannot import by name, so it loads that file before unpickling."""
    module = sys.modules.get(fn.__module__)
    return fn.__module__, getattr(module, "__file__", None), pickle.dumps((fn, args, kwargs))


def _unpack_call(call: tuple[str, str | None, bytes]) -> tuple[Callable[..., Any], tuple, dict]:
    name, path, payload = call
    if name not in sys.modules and path is not None:
        try:
            importable = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            importable = False
        if not importable:
            load_module(name, path)
    return pickle.loads(payload)


def _run_rank(local_rank: int, call: tuple[str, str | None, bytes], world: int, backend: str, port: int,
              timeout_s: float, result_path: str | None) -> Any:
    """One rank: set the env:// variables, create the group, run the call, hand rank 0's result back."""
    fn, args, kwargs = _unpack_call(call)
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    if result_path is not None:
        ignore_sigint()  # Ctrl-C reaches the whole process group; the launching process stops the ranks
        watch_parent(os.getppid(), 0.5, lambda: os._exit(1))  # exit with the launching process
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        if result_path is not None:  # stamp the failure before the peers see our connections close
            _write_failure(os.path.dirname(result_path), local_rank, traceback.format_exc())
        raise
    else:
        if local_rank == 0 and result_path is not None:
            torch.save(result, result_path)
        return result
    finally:
        dist.destroy_process_group()
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
