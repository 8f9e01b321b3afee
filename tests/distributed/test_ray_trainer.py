"""``trainer.kind=ray`` on a Ray cluster of a head and two simulated nodes (loopback, own network namespace): the real
recipe, the real layout a user runs (a driver pointed at a cluster with ``trainer.ray_address``), and its faults."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tdrl.ckpt import Checkpointer, read_checkpoint
from tdrl.distributed.ray_trainer import describe
from tests.distributed.cluster import ADDRESS, LoopbackCluster, can_make_namespaces

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
ACTOR = "ray::CollectorActor"


def apex_args(run_dir: Path, frames: int, *extra: str) -> list[str]:
    """Ape-X DQN on CartPole, small enough for two busy cores: 4 actors over the two nodes."""
    return [sys.executable, str(ROOT / "recipes" / "dqn.py"), "trainer.kind=ray", f"trainer.ray_address={ADDRESS}",
            "trainer.n_actors=4", "trainer.updates_per_sync=8", "trainer.call_timeout_s=20",
            "replay.prioritized=true", "model.hidden_sizes=[32,32]", "optim.replay_ratio=8",
            "optim.min_steps_learn=256", f"collector.total_frames={frames}", "logger.log_interval_steps=256",
            "eval.n_envs=0", "logger.wandb=false", "logger.progress_bar=false", "run.torch_threads=1",
            f"run.dir={run_dir}", *extra]


def rows(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "progress.csv") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-3000:] if proc.stderr is not None else ""
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}: {err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def logged_max(run_dir: Path, column: str) -> float:
    """The largest value of ``column`` in the run's log so far (0 before any row)."""
    try:
        return max((r.get(column, 0.0) for r in rows(run_dir)), default=0.0)
    except FileNotFoundError:
        return 0.0


def frames_logged(run_dir: Path) -> float:
    return logged_max(run_dir, "CumSteps")


def restarts_logged(run_dir: Path) -> float:
    return logged_max(run_dir, "actors/restarts")


def all_actors_collected(run_dir: Path, n: int = 4) -> bool:
    try:
        table = rows(run_dir)
    except (FileNotFoundError, KeyError):
        return False
    return all(any(r.get(f"actors/fps_{i}", 0) > 0 for r in table) for i in range(n))


def no_actor_left(cluster: LoopbackCluster) -> None:
    wait_for(lambda: not cluster.processes(ACTOR) and not cluster.processes("ray::LearnerHub"), 30,
             "the run's actors to exit")


def test_apex_dqn_spans_both_nodes_and_throttles_to_the_replay_ratio(cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = cluster.run(apex_args(run_dir, 2048, "optim.replay_ratio=32"), timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 2048 and summary["updates"] > 0
    assert summary["actor_nodes"] == 2, summary  # 4 actors of 1 CPU on two nodes of 2 CPUs (the head has none)
    assert summary["actor_restarts"] == 0
    table = rows(run_dir)
    last = table[-1]
    for column in ("actors/fps_0", "actors/fps_3", "actors/weight_lag_max", "actors/in_flight",
                   "ray/wire_bytes_per_frame", "ray/bytes_in_flight", "replay/ratio"):
        assert column in last, sorted(last)
    assert 0 < last["ray/wire_bytes_per_frame"] < 10_000
    # a rollout is whole batches of dqn's 8 frames, within the actor's share of the replay's slack: at most a
    # quarter of the 256-frame warm-up (rounded up to a batch), then one batch (max_lag_frames=0)
    largest_rollout = max(row["actors/rollout_frames_max"] for row in table[1:])
    assert largest_rollout % 8 == 0 and largest_rollout <= 256 // 4, largest_rollout
    assert table[-1]["actors/rollout_frames_max"] == 8, table[-1]
    # the weights (two 32-unit layers: 5.1 KB) and at most 2 rollouts per actor, each at most the largest rollout's
    # CartPole transitions (69 B a frame) and a weights pull
    assert 5_000 < last["ray/bytes_in_flight"] < 5_200 + 2 * 4 * (largest_rollout * 100 + 5_200), last
    # the slow learner (32 samples per frame) holds the actors back: what it has not learned from stays within
    # one rollout per write (hub throttle, max_lag_frames=0), and in-flight rollouts within 2 per actor
    for row in table[1:]:
        unlearned = row["replay/writes"] - 256 - row["replay/samples"] / 32
        assert unlearned <= largest_rollout + 64 / 32, row
        assert row["actors/in_flight"] <= 2 * 4
    no_actor_left(cluster)


def test_plain_torchrl_modules_collect_and_learn_as_ray_actors(cluster, tmp_path):
    """A user's own loop (plain_torchrl_apex.py): TorchRL's QValueActor + EGreedyModule as the actors' policy and
    TorchRL's DQNLoss in the learner, no tdrl model. The actors act with the weights the learner publishes, so the
    training return rises from the untrained network's ~10 (measured: 10.3 -> 33.3 over 6k frames)."""
    out = tmp_path / "summary.json"
    proc = cluster.run([sys.executable, str(ROOT / "tests" / "distributed" / "plain_torchrl_apex.py"), ADDRESS,
                        "6000", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["frames"] >= 6000 and summary["updates"] > 0 and summary["actor_restarts"] == 0, summary
    assert summary["actor_nodes"] == 2, summary
    returns = [point["return_mean"] for point in summary["curve"]]
    assert returns[-1] > 2 * returns[0], returns
    no_actor_left(cluster)


def end_with_sigterm(proc: subprocess.Popen, stderr_path: Path) -> str:
    """SIGTERM the run as a user's Ctrl-C would; its stderr, once it exited 143 (checkpoint, one line)."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    err = stderr_path.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    return err


def spare_pids(err: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"a spare collector actor is ready \(pid (\d+)\)", err)]


def test_actor_sigkill_is_replaced_by_the_spare_and_counted(cluster, tmp_path):
    """Open-ended, so the test waits for the events rather than racing a frame budget: a working actor (not the
    spare) SIGKILLed, the spare in its place and collecting within 10 s, a new spare built, the restart counted in a
    log row, more frames; then SIGTERM ends it (exit 143). The run's stderr is read from a file while it goes on."""
    run_dir, stderr_path = tmp_path / "run", tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = cluster.popen(apex_args(run_dir, 10_000_000), stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        # every actor has collected (one killed while it builds its collector is restarted before it ever answers,
        # which the learner cannot tell from a slow start), and the spare is built
        wait_for(lambda: all_actors_collected(run_dir), 240, "every actor's first frames", proc)
        wait_for(lambda: spare_pids(stderr_path.read_text()), 120, "the spare built", proc)
        (spare,) = spare_pids(stderr_path.read_text())
        working = [pid for pid in cluster.processes(ACTOR) if pid != spare]
        assert len(working) == 4, (working, spare)
        os.kill(working[0], signal.SIGKILL)
        killed_at, killed_at_frames = time.monotonic(), frames_logged(run_dir)
        wait_for(lambda: "is back after" in stderr_path.read_text(), 120, "the spare collecting", proc)
        kill_to_back_s = time.monotonic() - killed_at  # the death noticed, the spare swapped in, a rollout done
        wait_for(lambda: len(spare_pids(stderr_path.read_text())) == 2, 120, "a new spare built", proc)
        wait_for(lambda: restarts_logged(run_dir) >= 1, 60, "the restart in a log row", proc)
        wait_for(lambda: frames_logged(run_dir) >= killed_at_frames + 2048, 120, "frames after the restart", proc)
        err = end_with_sigterm(proc, stderr_path)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"the spare (pid {spare}) takes its place, restart 1" in err, err[-3000:]
    back = re.findall(r"collector actor \d is back after ([\d.]+) s \(the spare, pid (\d+)\)", err)
    # from the SIGKILL to the spare's first rollout in the dead actor's slot, as the run reports it. A Ray restart
    # instead (spare_actors=0) took 4 s on an idle machine and 8-12 s here, where the run's 3 other actors and its
    # learner keep both cores busy while the new process imports torch and builds its collector
    assert back and int(back[0][1]) == spare and kill_to_back_s < 10, (kill_to_back_s, err[-3000:])
    no_actor_left(cluster)


def test_without_a_spare_ray_restarts_a_killed_actor(cluster, tmp_path):
    """trainer.spare_actors=0: the same SIGKILL, and Ray restarts the actor (a new process that imports torch and
    builds its collector); it is back, counted once, and collecting again."""
    run_dir, stderr_path = tmp_path / "run", tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        proc = cluster.popen(apex_args(run_dir, 10_000_000, "trainer.spare_actors=0"), stdout=subprocess.DEVNULL,
                             stderr=stderr, text=True)
    try:
        wait_for(lambda: all_actors_collected(run_dir), 240, "every actor's first frames", proc)
        victims = cluster.processes(ACTOR)
        assert len(victims) == 4, victims  # no spare
        os.kill(victims[0], signal.SIGKILL)
        wait_for(lambda: "is back after" in stderr_path.read_text(), 120, "the restarted actor back", proc)
        wait_for(lambda: restarts_logged(run_dir) >= 1, 60, "the restart in a log row", proc)
        err = end_with_sigterm(proc, stderr_path)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Ray restarts it, restart 1" in err and "the spare" not in err, err[-3000:]
    back = re.findall(r"collector actor \d is back after ([\d.]+) s \(pid \d+\)", err)
    assert back and float(back[0]) < 30, err[-3000:]  # 4 s idle; 8-12 s on the test's 2 busy cores
    no_actor_left(cluster)


def test_learner_sigkill_then_relaunch_restores_the_checkpoint(cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = apex_args(run_dir, 4096, "checkpoint.interval_steps=512")
    proc = cluster.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # the Checkpointer is built once the run made its folder: a run.dir it did not make is refused
        wait_for(lambda: (run_dir / "checkpoints").is_dir() and len(Checkpointer(run_dir / "checkpoints").list()) >= 2,
                 300, "two checkpoints", proc)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    no_actor_left(cluster)  # the learner owned them: Ray ends them with it
    checkpoints = Checkpointer(run_dir / "checkpoints")
    newest, _ = checkpoints.newest_valid()
    saved = read_checkpoint(newest.path)["state"]["digest"]
    assert saved["replay_size"] > 0 and saved["updates"] > 0 and saved["priority_sum"] > 0
    relaunch = cluster.run(args, timeout=400)
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert f"tdrl: resumed {describe(saved)} (equal to the checkpoint's)" in relaunch.stderr, relaunch.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 4096
    no_actor_left(cluster)


FAULTY_ACTOR = """
import os, pathlib
from tdrl.distributed.actor_pool import ActorPool
from tdrl.distributed.ray_actors import RayTrainerError, Rollout, ray_runtime_calls

@ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0)
class Faulty:
    def __init__(self, fault):
        self.marker = pathlib.Path(DIR) / fault  # the fault happens once: a restarted actor works
    def pid(self):
        return os.getpid()
    def rollout(self, mode, index):
        if not self.marker.exists():
            self.marker.touch()
            if self.marker.name == "runtime":
                with ray_runtime_calls():
                    raise BrokenPipeError(32, "Broken pipe")
            raise ValueError("the collector's own error")
        return Rollout(index, 8, 0, [], 0.01, 0, os.getpid(), "node")

pool = ActorPool(lambda number, spare: Faulty.remote("runtime"), 1, mode="replay", spares=0)
frames = 0
while frames < 16:
    frames += sum(report.frames for report in pool.poll(timeout=5.0))
print("restarts:", pool.restarts, pool.events)
pool = ActorPool(lambda number, spare: Faulty.remote("own"), 1, mode="replay", spares=0)
try:
    while True:
        pool.poll(timeout=5.0)
except RayTrainerError as error:
    print("stopped:", str(error).splitlines()[0])
"""


def test_a_failed_call_into_ray_restarts_the_actor_and_its_own_error_stops_the_run(cluster, tmp_path):
    """A CI run that killed a node saw an actor of that node return ``OSError: Broken pipe`` from ``ray.get`` (its
    raylet gone) before Ray counted it dead, and the pool took it for the collector's error and stopped the run.
    Calls into Ray now raise ``ActorRuntimeLost`` there, which the pool answers with a restart (one, counted once);
    any other error still stops the run. Real Ray actors on the cluster, the fault injected once in each."""
    out = cluster.python(f"DIR = {str(tmp_path)!r}\n" + FAULTY_ACTOR, timeout=120)
    assert out.startswith("restarts: 1 "), out
    assert "collector actor 0 died: a call into Ray failed in this actor: BrokenPipeError(32, " in out, out
    assert "Ray restarts it, restart 1" in out, out
    died, back = (int(pid) for pid in re.findall(r"\(pid (\d+)\)", out)[:2])
    assert back != died, out  # ray.kill does not wait: the killed process may answer the first probe (a CI run)
    assert "stopped: collector actor 0 raised in its rollout (not retried):" in out, out


def test_losing_a_node_shrinks_the_actors_and_the_run_goes_on(cluster, tmp_path):
    """Last in this module: the cluster has one node fewer afterwards.

    The node goes once every actor has collected (a node lost mid-run; actors still building their collectors when
    their node goes count only at start_timeout_s, 120 s: Ray queues calls to a restartable actor it cannot place).
    The run is open-ended and the test waits for the event itself: the loss counted in the log (measured 2 s after
    the node went), then 1,024 more frames from the actors left. A run that ended on a frame budget raced both (a CI
    run of 12,288 frames ended 36 s after its start, the loss not yet counted). SIGTERM then ends it as a user's
    Ctrl-C would: checkpoint, one line, exit 143."""
    run_dir = tmp_path / "run"
    proc = cluster.popen(apex_args(run_dir, 10_000_000), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: all_actors_collected(run_dir), 240, "every actor's first frames", proc)
        cluster.remove_node(1)
        wait_for(lambda: restarts_logged(run_dir) >= 1, 240, "the lost actors counted", proc)
        counted_at = frames_logged(run_dir)
        wait_for(lambda: frames_logged(run_dir) >= counted_at + 1024, 240, "frames after the loss", proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "died" in err or "timed out" in err, err[-3000:]
    assert "resume with:" in err.strip().splitlines()[-1], err[-3000:]
    assert Checkpointer(run_dir / "checkpoints").list(), "SIGTERM checkpoints at the next round"
    no_actor_left(cluster)


def test_impala_on_a_ray_of_its_own_leaves_no_process(tmp_path):
    """The README's laptop command: no address, so the run starts Ray itself, and nothing outlives it."""
    if (why := can_make_namespaces()) is not None:
        pytest.skip(f"Ray loopback cluster: {why}")
    bare = LoopbackCluster(tmp_path, start=False)
    try:
        proc = bare.run([sys.executable, str(ROOT / "recipes" / "impala.py"), "trainer.kind=ray",
                         "collector.total_frames=3200", "logger.log_interval_steps=1600", "eval.n_envs=2",
                         "logger.wandb=false", "logger.progress_bar=false", f"run.dir={tmp_path / 'run'}"], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["frames"] >= 3200 and summary["actors"] == 4 and summary["updates"] >= 3200 // 80 - 4
        table = rows(tmp_path / "run")
        assert "actors/weight_lag_max" in table[-1] and "train/policy_lag_mean" in table[-1], sorted(table[-1])
        wait_for(lambda: not bare.pids(), 30, "every process of the run's own Ray to exit")
    finally:
        assert not bare.stop()
