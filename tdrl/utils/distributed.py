"""torch.distributed helpers for data-parallel training: rank queries, per-rank seeds, backend and size checks.

They sit below every other tdrl layer so trainers and launchers share one definition of "which process am I".
The process group comes from :func:`init_from_env` (``env://`` variables from ``torchrun`` or
:mod:`tdrl.launch.distributed`) or from the local launcher in :mod:`tdrl.distributed.ddp_launch`. Without a process
group, a plain process is rank 0 of a world of size 1.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from tdrl.utils.errors import UserError

__all__ = ["BACKENDS", "DistributedSetupError", "available_cpus", "check_local_world_size", "env_world", "free_port",
    "init_from_env", "is_distributed", "is_main_process", "local_rank", "rank", "rank_seed", "resolve_backend",
    "resolve_device", "world_size"]

BACKENDS = ("auto", "gloo", "nccl")  # auto: NCCL for CUDA devices, gloo otherwise


class DistributedSetupError(UserError):
    """A data-parallel setting cannot work here (no CUDA for NCCL, more ranks than cores...); raised before any
    process starts, naming the offending setting."""


def is_distributed() -> bool:
    """Whether this process belongs to an initialised torch.distributed process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of ranks (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def local_rank() -> int:
    """Rank on this machine (``LOCAL_RANK``; the global rank for a single-machine group; 0 otherwise)."""
    value = os.environ.get("LOCAL_RANK")
    return int(value) if value is not None else rank()


def is_main_process() -> bool:
    """True on rank 0 (and in a plain single process): the process that evaluates, logs and checkpoints."""
    return rank() == 0


def rank_seed(seed: int, rank_: int | None = None) -> int:
    """Seed for one rank of a data-parallel run: rank 0 keeps ``seed``, rank r > 0 gets an independent stream.

    Seeding every rank with the same number would make every replica collect the same episodes (and all-reduced
    gradients would be N copies of one). ``SeedSequence([seed, r])`` keeps runs with neighbouring seeds apart
    (``seed + r`` would make rank 1 of seed 0 replay rank 0 of seed 1).
    """
    r = rank() if rank_ is None else int(rank_)
    if r == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, r]).generate_state(1)[0])


def env_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` from torch's ``env://`` variables, or ``None`` when they are not set."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def resolve_device(name: str, *, key: str = "run.device") -> torch.device:
    """``torch.device(name)``, checked against this machine: a CUDA device needs a visible GPU of that index.

    Raises :class:`UserError` naming ``key`` otherwise (before any model or process is built on it).
    """
    device = torch.device(name)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= visible:
        raise UserError(f"{key}={name!r}, but this machine has {visible} usable CUDA device(s); use {key}=cpu")
    return device


def resolve_backend(backend: str, device: str | torch.device = "cpu", *, key: str = "backend") -> str:
    """The torch.distributed backend for ``device``: ``auto`` → NCCL on CUDA, gloo on CPU.

    Raises :class:`DistributedSetupError` for an unknown name, NCCL without CUDA (or for CPU tensors), or a backend
    this torch build lacks.
    """
    if backend not in BACKENDS:
        raise DistributedSetupError(f"{key}={backend!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    device_type = torch.device(device).type
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DistributedSetupError(f"{key}='nccl' needs CUDA, and this machine has no usable GPU "
                                        "(torch.cuda.is_available() is False); use gloo for CPU training")
        if device_type != "cuda":
            raise DistributedSetupError(f"{key}='nccl' reduces CUDA tensors only, but the learner device is "
                                        f"{str(device)!r}; set the device to cuda or use gloo")
        if not dist.is_nccl_available():
            raise DistributedSetupError(f"{key}='nccl': this torch build has no NCCL support")
    if backend == "gloo" and not dist.is_gloo_available():
        raise DistributedSetupError(f"{key}='gloo': this torch build has no gloo support")
    return backend


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a SLURM allocation or a local slot)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_local_world_size(world_size_: int, backend: str, *, key: str = "world_size") -> None:
    """Refuse (:class:`DistributedSetupError`) a non-positive ``world_size`` or more local ranks than GPUs (NCCL)
    or CPU cores (gloo): each rank runs a full collector-and-learner replica; two replicas on one core only take
    turns, and NCCL cannot put two ranks on one GPU."""
    if not isinstance(world_size_, int) or isinstance(world_size_, bool) or world_size_ < 1:
        raise DistributedSetupError(f"{key} must be a positive int (number of ranks), got {world_size_!r}")
    if backend == "nccl":
        limit, what = torch.cuda.device_count(), "CUDA device(s) visible here (one rank per GPU with NCCL)"
    else:
        limit, what = available_cpus(), "CPU core(s) this process may use (each rank runs a collector and learner)"
    if world_size_ > limit:
        raise DistributedSetupError(f"{key}={world_size_} exceeds the {limit} {what}; use {key}<={limit}")


def free_port() -> int:
    """An unused TCP port on the loopback interface, for a local rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_from_env(backend: str = "auto", device: str | torch.device = "cpu", timeout_s: float = 1800.0) -> int:
    """Create the default process group from ``env://`` variables (torchrun, or tdrl.launch under SLURM); returns
    this process's rank.

    With NCCL the current CUDA device becomes ``cuda:LOCAL_RANK`` (modulo the visible devices), so tensors the
    recipe puts on ``"cuda"`` land on this rank's GPU. Raises :class:`DistributedSetupError` when the variables
    are missing or the backend cannot work here.
    """
    world = env_world()
    if world is None:
        raise DistributedSetupError("RANK and WORLD_SIZE are not set; start with torchrun or a tdrl SLURM launch")
    backend = resolve_backend(backend, device)
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", world[0]))
        torch.cuda.set_device(local % torch.cuda.device_count())
    if not is_distributed():
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    return rank()
