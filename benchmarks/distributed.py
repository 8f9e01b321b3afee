"""Throughput of ``trainer.kind=ray`` against the local parallel collector, in the same run, at equal cores.

A Ray cluster of a head and two simulated nodes of one CPU each runs on loopback in its own network namespace
(``tests/distributed/cluster.py``), so Ray's actors get two CPUs in all, as the local collector's two worker
processes do. Each row fills a prioritized replay with CartPole-v1 frames acted by DQN's default Q-network and
epsilon-greedy (16 envs in all, 32 steps per batch), for ``--seconds`` after a warm-up:

- ``local parallel (W workers)``: ``make_collector("parallel", n_workers=W)`` writing into the replay in this
  process, W = 1, 2 and 4;
- ``ray, N actors``: N collector actors (serial collectors of 16/N envs; 1 CPU each, 0.5 for 4 actors, so N actors
  reserve the CPUs of the N local workers they are compared with, at most the 2 the cluster has) writing through
  the learner hub, the path of Ape-X (the data never passes the learner's process). Each is compared with the local
  collector of as many processes stepping as many envs each (N actors: N workers), so the ratio is what Ray's path
  costs, not what smaller batches per process cost.

Then the learner: DQN updates/s (batch 64, the recipe's network) sampling the replay, with no actor running and
with 4 actors writing. Bytes on the wire per frame: the rollouts' tensors plus the weights pulled.

    python benchmarks/distributed.py                       # about 4 minutes
    python benchmarks/distributed.py --markdown docs/throughput.md#ray-collection  # its section, in place
    python benchmarks/distributed.py --batch-t 128                         # 2,048 frames per round of calls

``--learning ARGS...``: run ``benchmarks/learning.py ARGS`` as a driver on a cluster of a head and two simulated
nodes of 2 CPUs (4 actors of 1 CPU), with ``RAY_ADDRESS`` set, for its ``trainer.kind=ray`` tasks::

    python benchmarks/distributed.py --learning --tasks apex-dqn-cartpole --seeds 0,1,2 --no-sb3 --stop --json a.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ENVS, BATCH_T = 16, 32


def build(scratch: Path):
    """The DQN policy, a prioritized replay and the collector factory of the rows."""
    import torch

    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory
    from tdrl.models import EpsilonGreedy, chain_policy, make_q_actor
    from tdrl.replay import PrioritizedSampler, TransitionReplayBuffer

    torch.set_num_threads(1)
    env_factory = EnvFactory("CartPole-v1")
    q_actor = make_q_actor(env_factory.specs(), hidden_sizes=[256, 256], dueling=True)
    policy = chain_policy(q_actor, EpsilonGreedy(2, eps_init=0.1, eps_final=0.1))
    replay = TransitionReplayBuffer(scratch, 200_000, sampler=PrioritizedSampler(seed=0), n_step=3,
                                    keys=["observation", "action", ("next", "observation"), ("next", "reward"),
                                          ("next", "done"), ("next", "terminated"), ("next", "truncated")], seed=0)

    def factory(kind: str, envs: int, workers: int = 2):
        return partial(make_collector, kind, env_factory, policy, batch_B=envs, batch_T=BATCH_T, n_workers=workers,
                       seed=0, return_same_td=True)

    return q_actor, policy, replay, factory


def cpu_seconds_by_role() -> dict[int, tuple[str, float]]:
    """``{pid: (role, CPU seconds so far)}`` (user + system, from /proc) of the processes in a row: ``learner``
    (this process and its children: the local collector's workers), ``actors``, ``hub`` and ``ray`` (Ray's own
    processes: raylets, GCS, idle workers)."""
    tick, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    parents, cpu, role = {}, {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(stat.parent.name)
        parents[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        role[pid] = ("actors" if "ray::CollectorActor" in cmdline else "hub" if "ray::LearnerHub" in cmdline
                     else "ray" if "ray::" in cmdline or f"{os.sep}ray{os.sep}" in cmdline
                     else "")
    found = {}
    for pid, seconds in cpu.items():
        ancestor = pid
        while ancestor not in (0, 1, me) and ancestor in parents:
            ancestor = parents[ancestor]
        if role[pid] in ("actors", "hub"):
            found[pid] = (role[pid], seconds)
        elif ancestor == me:  # before Ray's own: a forkserver's command line names ray's paths in its sys.path
            found[pid] = ("learner", seconds)
        elif role[pid]:
            found[pid] = ("ray", seconds)
    return found


def cpu_ms_per_kframe(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                      frames: int) -> dict[str, float]:
    """Per role, the CPU the processes alive at the end used since ``before`` (a process of the previous row still
    exiting at the start is not counted), in ms per 1,000 frames."""
    totals = {"learner": 0.0, "actors": 0.0, "hub": 0.0, "ray": 0.0}
    for pid, (role, seconds) in after.items():
        totals[role] += seconds - before.get(pid, (role, 0.0))[1]
    return {k: v * 1e6 / max(frames, 1) for k, v in totals.items()}


def local_row(workers: int, seconds: float, scratch: Path) -> dict:
    _, _, replay, factory = build(scratch)
    collector = factory("parallel", ENVS, workers)()
    try:
        batches = iter(collector)
        for _ in range(3):  # warm-up: workers started, first batches
            replay.extend(next(batches))
        frames, start, before = 0, time.perf_counter(), cpu_seconds_by_role()
        while time.perf_counter() - start < seconds:
            batch = next(batches)
            replay.extend(batch)
            frames += batch.numel()
        cpu = cpu_ms_per_kframe(before, cpu_seconds_by_role(), frames)
        return {"row": f"local parallel ({workers} workers)", "fps": frames / (time.perf_counter() - start),
                "bytes": 0.0, "processes": workers, "cpu": cpu}
    finally:
        collector.shutdown()


def start_pool(n_actors: int, scratch: Path, *, hub_kwargs: dict | None = None):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from tensordict import TensorDict

    from tdrl.distributed import module_path
    from tdrl.distributed.actor_pool import ActorPool
    from tdrl.distributed.ray_actors import CollectorActor, LearnerHub, to_wire

    q_actor, policy, replay, factory = build(scratch)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    hub: Any = ray.remote(LearnerHub).options(num_cpus=0, max_concurrency=8, scheduling_strategy=here).remote(
        replay, **(hub_kwargs or {}))
    ray.get(hub.publish.remote(1, [ray.put(to_wire(TensorDict.from_module(q_actor).data))]))
    factory_ref = ray.put(factory("serial", ENVS // n_actors))
    path = module_path(policy, q_actor)
    cpus = min(1.0, 2 / n_actors)  # a node has one CPU
    actor_class = ray.remote(CollectorActor).options(num_cpus=cpus, max_restarts=-1, max_task_retries=0)
    pool = ActorPool(lambda i, spare: actor_class.remote(n_actors, [factory_ref], i, weights_path=path, hub=hub),
                     n_actors, mode="replay", spares=0)
    return q_actor, replay, hub, pool, factory_ref


def ray_row(n_actors: int, seconds: float, scratch: Path) -> dict:
    _, _, hub, pool, _ = start_pool(n_actors, scratch)
    try:
        deadline = time.monotonic() + 300
        while sum(s.started for s in pool.slots) < n_actors:  # warm-up: every actor built and collecting
            pool.poll(timeout=1.0)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n_actors} actors did not start within 300 s")
        for _ in range(2 * n_actors):
            pool.poll(timeout=5.0)
        frames = wire = 0
        start, before = time.perf_counter(), cpu_seconds_by_role()
        while time.perf_counter() - start < seconds:
            for report in pool.poll(timeout=0.5):
                frames += report.frames
                wire += report.wire_bytes
        fps = frames / (time.perf_counter() - start)
        cpu = cpu_ms_per_kframe(before, cpu_seconds_by_role(), frames)
        return {"row": f"ray, {n_actors} actor{'s' * (n_actors > 1)} ({min(1, 2 / n_actors):g} CPU each)", "fps": fps,
                "bytes": wire / max(frames, 1), "processes": n_actors, "cpu": cpu}
    finally:
        pool.shutdown()


def learner_rows(seconds: float, scratch: Path) -> list[dict]:
    import torch

    from tdrl.objectives.dqn import make_dqn_loss

    q_actor, replay, hub, pool, _ = start_pool(4, scratch)
    loss = make_dqn_loss(q_actor, gamma=0.99, double_dqn=True)
    optimizer = torch.optim.Adam(q_actor.parameters(), lr=1e-4)

    def updates_per_s(polling: bool) -> float:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            sample = replay.sample(64)
            optimizer.zero_grad()
            loss(sample)["loss"].backward()
            optimizer.step()
            replay.update_priority(sample["index"], sample["td_error"].detach().sqrt().reshape(-1))
            n += 1
            if polling and n % 16 == 0:
                pool.poll(timeout=0.0)
        return n / (time.perf_counter() - start)

    try:
        while len(replay) < 20_000:
            pool.poll(timeout=1.0)
        with_actors = updates_per_s(True)
    finally:
        pool.shutdown()
    time.sleep(2.0)
    alone = updates_per_s(False)
    return [{"row": "learner, no actor running", "ups": alone},
            {"row": "learner, 4 actors writing", "ups": with_actors}]


def inner(args: argparse.Namespace) -> None:
    """In the cluster's namespace: measure and print one JSON line per row."""
    import ray

    global BATCH_T
    BATCH_T = args.batch_t

    ray.init(address=args.address, logging_level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tdrl-bench-dist-") as root:
        rows = []
        for rnd in range(args.rounds):  # interleaved, so drifting load hits every row alike
            for n in (1, 2, 4):  # n actors against n local workers
                rows.append({**local_row(n, args.seconds, Path(root) / f"local{n}-{rnd}"), "round": rnd})
                rows.append({**ray_row(n, args.seconds, Path(root) / f"ray{n}-{rnd}"), "round": rnd})
        rows += learner_rows(args.seconds, Path(root) / "learner")
    for row in rows:
        print("ROW " + json.dumps(row), flush=True)


def _cluster_module() -> Any:
    """``tests/distributed/cluster.py``: the loopback Ray cluster of the distributed tests (a script, not a
    package, so imported by name from its directory)."""
    sys.path.insert(0, str(REPO / "tests" / "distributed"))
    return importlib.import_module("cluster")


def main() -> None:
    from report import add_markdown_option

    cluster_module = _cluster_module()
    ADDRESS, LoopbackCluster = cluster_module.ADDRESS, cluster_module.LoopbackCluster
    can_make_namespaces = cluster_module.can_make_namespaces

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per row")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the collection rows")
    parser.add_argument("--batch-t", type=int, default=32,
                        help="steps per env per batch (T): each rollout call carries 16 x T frames over the actors")
    add_markdown_option(parser)
    args = parser.parse_args()
    global BATCH_T
    BATCH_T = args.batch_t
    if (why := can_make_namespaces()) is not None:
        raise SystemExit(f"benchmarks/distributed.py {why}")
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="tdrl-bench-cluster-") as work:
        cluster = LoopbackCluster(Path(work), n_nodes=2, cpus=1)
        try:
            proc = cluster.run([sys.executable, __file__, "--inner", "--address", ADDRESS, "--seconds",
                                str(args.seconds), "--rounds", str(args.rounds), "--batch-t", str(args.batch_t)],
                               timeout=3000)
        finally:
            cluster.stop()
    rows = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode or not rows:
        raise SystemExit(f"the measurement failed:\n{proc.stderr[-3000:]}")
    local = {(r["round"], r["processes"]): r["fps"] for r in rows if r.get("row", "").startswith("local")}
    print(f"\nCartPole-v1 frames/s into a prioritized replay, 2 CPUs for collection ({ENVS} envs, T={BATCH_T}, "
          f"DQN 256x256 + epsilon-greedy; load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    print(f"{'collection':<34} {'round':>5} {'frames/s':>9} {'x local':>8} {'overhead/frame':>15} {'wire B/frame':>13}")
    for r in rows:
        if "fps" not in r:
            continue
        base = local[r["round"], r["processes"]]  # the local collector with as many processes
        print(f"{r['row']:<34} {r['round']:>5} {r['fps']:>9.0f} {r['fps'] / base:>7.2f}x "
              f"{(base / r['fps'] - 1) * 100:>14.1f}% {r['bytes']:>13.0f}")
    print("\nmedian over rounds (N actors against N local workers)")
    for n in sorted({r["processes"] for r in rows if r.get("row", "").startswith("ray")}):
        ratios = sorted(local[r["round"], n] / r["fps"] - 1 for r in rows
                        if r.get("row", "").startswith("ray") and r["processes"] == n)
        print(f"ray, {n} actor{'s' * (n > 1)}: overhead per frame {statistics.median(ratios) * 100:.1f}% "
              f"(rounds: {', '.join(f'{x * 100:.1f}%' for x in ratios)})")
    print("\nCPU ms per 1,000 frames, by process (/proc; the learner row includes the local collector's workers)")
    print(f"{'collection':<34} {'round':>5} {'learner':>8} {'actors':>8} {'hub':>8} {'ray':>8} {'total':>8}")
    for r in rows:
        if "cpu" in r:
            c = r["cpu"]
            print(f"{r['row']:<34} {r['round']:>5} {c['learner']:>8.1f} {c['actors']:>8.1f} {c['hub']:>8.1f} "
                  f"{c['ray']:>8.1f} {sum(c.values()):>8.1f}")
    print("\nlearner (DQN 256x256, batch 64, prioritized replay of CartPole frames)")
    for r in rows:
        if "ups" in r:
            print(f"{r['row']:<34} {r['ups']:>9.1f} updates/s")


def learning(args: list[str]) -> int:
    cluster_module = _cluster_module()
    ADDRESS, LoopbackCluster = cluster_module.ADDRESS, cluster_module.LoopbackCluster

    with tempfile.TemporaryDirectory(prefix="tdrl-bench-cluster-") as work:
        cluster = LoopbackCluster(Path(work), n_nodes=2, cpus=2)
        try:
            proc = cluster.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), *args], timeout=20_000,
                               env={"RAY_ADDRESS": ADDRESS}, cwd=work)
        finally:
            cluster.stop()
    print(proc.stdout)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["--learning"]:
        raise SystemExit(learning(sys.argv[2:]))
    if "--inner" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--inner", action="store_true")
        parser.add_argument("--address")
        parser.add_argument("--seconds", type=float)
        parser.add_argument("--rounds", type=int)
        parser.add_argument("--batch-t", type=int)
        inner(parser.parse_args())
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from report import markdown_page

        with markdown_page("Ray collection"):
            main()
