"""torch.distributed from SLURM's variables, for data-parallel runs launched as multi-task SLURM jobs.

With ``tasks_per_node=N`` (and/or ``nodes=M``) SLURM starts N*M copies of a run, one per rank, and tells each
its place in ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` / ``SLURM_JOB_NODELIST``.
:func:`slurm_dist_env` reads them; :func:`export_dist_env` turns them into the ``RANK`` / ``WORLD_SIZE`` /
``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` variables of torch's ``env://`` rendezvous (what torchrun
sets), so a trainer written for torchrun runs unchanged; :func:`init_distributed_from_slurm` also creates the
process group. Rank 0's host is the rendezvous; the port is derived from the job id so jobs sharing a node do
not collide (set ``MASTER_PORT`` to choose it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta

__all__ = ["DistEnv", "export_dist_env", "first_host", "init_distributed_from_slurm", "slurm_dist_env"]


@dataclass(frozen=True)
class DistEnv:
    """One process's place in a multi-process job."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    master_addr: str
    master_port: int


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list: ``"gpu[03-05,7],cpu1"`` -> ``"gpu03"``."""
    head = re.match(r"^([^,\[]*)(\[([^\]]*)\])?", nodelist.strip())
    if head is None or not head.group(1) and not head.group(3):
        raise ValueError(f"cannot read SLURM node list {nodelist!r}")
    prefix, ranges = head.group(1), head.group(3)
    if not ranges:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


def slurm_dist_env(port: int | None = None) -> DistEnv:
    """This SLURM task's rank, world size and rendezvous address.

    Raises:
        RuntimeError: not inside a SLURM task (``SLURM_PROCID`` unset), naming the missing variable.
    """
    env = os.environ
    missing = [k for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_JOB_ID") if k not in env]
    if missing:
        raise RuntimeError(
            f"not inside a SLURM task ({', '.join(missing)} unset); start with srun or a tdrl SLURM sweep"
        )
    if port is None:
        port = int(env.get("MASTER_PORT") or 20000 + int(re.sub(r"\D", "", env["SLURM_JOB_ID"]) or 0) % 40000)
    return DistEnv(
        rank=int(env["SLURM_PROCID"]),
        world_size=int(env["SLURM_NTASKS"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        node_rank=int(env.get("SLURM_NODEID", "0")),
        master_addr=env.get("MASTER_ADDR") or first_host(env["SLURM_JOB_NODELIST"]),
        master_port=port,
    )


def export_dist_env(dist: DistEnv) -> None:
    """Set torch's ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
    os.environ.update(
        RANK=str(dist.rank),
        WORLD_SIZE=str(dist.world_size),
        LOCAL_RANK=str(dist.local_rank),
        GROUP_RANK=str(dist.node_rank),
        MASTER_ADDR=dist.master_addr,
        MASTER_PORT=str(dist.master_port),
    )


def init_distributed_from_slurm(
    backend: str | None = None, timeout_s: float = 300.0, port: int | None = None
) -> DistEnv:
    """Create the default torch.distributed process group from SLURM's variables.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default NCCL when this task sees a GPU, else gloo.
        timeout_s: how long collectives (and the rendezvous) wait for the other ranks before raising.
        port: rendezvous port (default ``MASTER_PORT`` or one derived from the job id).

    Returns:
        This process's :class:`DistEnv`. With CUDA, the current device is set to the local rank's GPU.

    Raises:
        RuntimeError: not in a SLURM task, or NCCL asked for without CUDA.
    """
    import torch
    import torch.distributed as dist

    info = slurm_dist_env(port)
    export_dist_env(info)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    backend = backend or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise RuntimeError("backend 'nccl' needs CUDA, and this task sees no GPU; use 'gloo'")
    if cuda:
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    return info
