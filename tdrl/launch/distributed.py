"""torch.distributed from SLURM's variables, for data-parallel runs launched as multi-task SLURM jobs.

SLURM starts one copy of a run per task and tells each its place (``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID``, ``SLURM_JOB_NODELIST``); :func:`export_dist_env` turns that into the ``env://`` variables
torchrun would set, so a trainer written for torchrun runs unchanged. Rank 0's node is the rendezvous, by the
address SLURM reaches it at (its ``NodeAddr``), so no rank depends on name resolution picking the right interface.
The port is derived from the job id, so jobs sharing a node do not collide, and from the restart count, so a
requeued job meets in a fresh store rather than one a rank of the last start may still hold (submitit #1613).
``MASTER_ADDR``/``MASTER_PORT`` in the environment are ignored: sbatch copies them from the shell that submitted
the job, where they name some other rendezvous.
"""

from __future__ import annotations

import os
import re
import subprocess
import zlib
from dataclasses import dataclass

__all__ = ["DistEnv", "export_dist_env", "first_host", "init_distributed_from_slurm", "job_port", "node_address",
    "slurm_dist_env"]


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
    host = head.group(1) + (head.group(2) or "") if head else ""
    if not host:
        raise ValueError(f"cannot read SLURM node list {nodelist!r}")
    return host


def node_address(host: str) -> str:
    """The address SLURM reaches ``host`` at (its ``NodeAddr``), or ``host`` itself when scontrol cannot say.

    On a cluster whose node names resolve, that is the same host; where they do not (or resolve to another
    interface) it is the one address every node is known to reach.
    """
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", host], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return host
    found = re.search(r"\bNodeAddr=(\S+)", out.stdout) if out.returncode == 0 else None
    return found.group(1) if found else host


def job_port(offset: int = 0) -> int:
    """A port in 20000-59999 for this job's rendezvous, the same on every task, new after each requeue.

    ``offset`` separates services of one job (the Ray head uses its own).
    """
    env = os.environ
    key = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_RESTART_COUNT', '0')}.{offset}"
    return 20000 + zlib.crc32(key.encode()) % 40000


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
        port = job_port()
    return DistEnv(
        rank=int(env["SLURM_PROCID"]), world_size=int(env["SLURM_NTASKS"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")), node_rank=int(env.get("SLURM_NODEID", "0")),
        master_addr=node_address(first_host(env["SLURM_JOB_NODELIST"])), master_port=port,
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
