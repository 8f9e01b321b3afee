"""A minimal Ray driver for the Ray-on-SLURM test (until ``trainer.kind=ray`` lands): ``ray.init()`` connects to
``RAY_ADDRESS``, one actor is pinned to each node of the cluster and reports its host, Ray node id, address and
pid, and the driver writes them to ``ray_nodes.json`` and ``summary.json``.

    RAY_ADDRESS=10.87.0.11:6379 python tests/launch/ray_recipe.py run.dir=runs/ray
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig, parse_args


@dataclass
class Config:
    """Actors-on-every-node smoke recipe."""

    run: RunConfig = field(default_factory=RunConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    hold_s: float = 0.0
    """Keep the actors alive this long before returning (to preempt or kill the job meanwhile)."""


def main(cfg: Config) -> dict:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    t0 = time.time()
    ray.init(logging_level="ERROR", log_to_driver=False)  # no address: RAY_ADDRESS, set by the launcher

    @ray.remote(num_cpus=1)
    class Where:
        def report(self) -> dict:
            return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
                    "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    nodes = [n for n in ray.nodes() if n["Alive"]]
    actors = [Where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
              for n in nodes]
    reports = ray.get([a.report.remote() for a in actors], timeout=120)
    time.sleep(cfg.hold_s)
    driver = {"host": socket.gethostname(), "ray_address": os.environ.get("RAY_ADDRESS"),
              "node_id": ray.get_runtime_context().get_node_id()}
    ray.shutdown()
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = {"driver": driver, "actors": reports, "nodes": [n["NodeManagerAddress"] for n in nodes]}
    (run_dir / "ray_nodes.json").write_text(json.dumps(out))
    summary = {"frames": 0, "wall_s": time.time() - t0, "eval/return_mean": 0.0, **out}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(parse_args(Config(), sys.argv[1:]))
