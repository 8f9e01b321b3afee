"""torch.distributed from SLURM's variables, for data-parallel runs launched as multi-task SLURM jobs.

SLURM starts one copy of a run per task and tells each its place (``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID``, ``SLURM_JOB_NODELIST``); :func:`export_dist_env` turns that into the ``env://`` variables
torchrun would set, so a trainer written for torchrun runs unchanged. Rank 0's host is the rendezvous; the port
is derived from the job id so jobs sharing a node do not collide (set ``MASTER_PORT`` to choose it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

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
    head = re.match(r"([^,\[]*)(?:\[(\d+))?", nodelist.strip())  # always matches, maybe empty
    host = head.group(1) + (head.group(2) or "")
    if not host:
        raise ValueError(f"cannot read SLURM node list {nodelist!r}")
    return host


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
        rank=int(env["SLURM_PROCID"]), world_size=int(env["SLURM_NTASKS"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")), node_rank=int(env.get("SLURM_NODEID", "0")),
        master_addr=env.get("MASTER_ADDR") or first_host(env["SLURM_JOB_NODELIST"]), master_port=port,
    )


def export_dist_env(dist: DistEnv) -> None:
    """Set torch's ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
    os.environ.update(
        RANK=str(dist.rank), WORLD_SIZE=str(dist.world_size), LOCAL_RANK=str(dist.local_rank),
        GROUP_RANK=str(dist.node_rank), MASTER_ADDR=dist.master_addr, MASTER_PORT=str(dist.master_port),
    )


def init_distributed_from_slurm(backend: str = "auto", timeout_s: float = 300.0, port: int | None = None) -> DistEnv:
    """Create the default process group from SLURM's variables and return this task's place.

    ``backend="auto"``: NCCL when this task sees a GPU, else gloo (see :func:`tdrl.utils.distributed.init_from_env`).
    """
    import torch

    from tdrl.utils.distributed import init_from_env  # torch only where a process group is made

    info = slurm_dist_env(port)
    export_dist_env(info)
    init_from_env(backend, "cuda" if torch.cuda.is_available() and backend != "gloo" else "cpu", timeout_s)
    return info
