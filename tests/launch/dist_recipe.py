"""A recipe for the multi-task SLURM test: every rank joins torch.distributed from SLURM's variables and
all-reduces its rank; each writes what it saw to ``rank_<r>.json``, rank 0 writes ``summary.json``."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig, parse_args
from tdrl.launch.distributed import init_distributed_from_slurm


@dataclass
class Config:
    """All-reduce smoke recipe."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def main(cfg: Config) -> dict:
    t0 = time.time()
    info = init_distributed_from_slurm(backend="gloo", timeout_s=60)
    value = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(value)
    gathered = [None] * info.world_size
    dist.all_gather_object(
        gathered, {"rank": info.rank, "pid": os.getpid(), "host": socket.gethostname()}
    )
    out = {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "backend": dist.get_backend(),
        "all_reduce_sum": value.item(),
        "peers": gathered,
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
    }
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"rank_{info.rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    summary = {"frames": 0, "wall_s": time.time() - t0, "eval/return_mean": 0.0, **out}
    if info.rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(parse_args(Config(), sys.argv[1:]))
