"""Parallel, action-server and alternating collectors: same data as serial, weight sync, faults, no orphans."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
import torch
from collect_helpers import (
    ConstantAction,
    StairsFactory,
    SuicideFactory,
    counter_policy,
    env_index_policy,
    mlp_policy,
)
from tensordict.nn import TensorDictModule

from tdrl.collect import CollectorError, make_collector
from tdrl.envs import EnvFactory

PARALLEL_KINDS = ["parallel", "action_server", "alternating"]


def _assert_same(a, b):
    assert a.batch_size == b.batch_size
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    diff = [k for k in a.keys(True, True) if not torch.equal(a.get(k), b.get(k))]
    assert not diff, f"keys differ: {diff}"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is reaped by its parent's join, so give it a moment.
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" in f.read()
    except FileNotFoundError:
        return True


def _assert_no_orphans(pids):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("tdrl-collector")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", PARALLEL_KINDS)
def test_same_batches_as_serial(kind):
    policy = mlp_policy(4, 2, discrete=True)
    kwargs = dict(batch_B=8, batch_T=40, seed=11, max_decorrelation_steps=20)
    with make_collector("serial", EnvFactory("CartPole-v1"), policy, **kwargs) as serial:
        expected = [serial.collect() for _ in range(2)]
        expected_infos = serial.traj_infos
    with make_collector(kind, EnvFactory("CartPole-v1"), policy, n_workers=2, **kwargs) as c:
        got = [c.collect() for _ in range(2)]
        infos = c.traj_infos
        pids = c.engine.pool.pids
    for a, b in zip(expected, got, strict=True):
        _assert_same(a, b)
    assert infos == expected_infos and infos
    _assert_no_orphans(pids)


@pytest.mark.timeout(90)
def test_wait_reset_recurrent_action_server_equals_serial():
    """Wait-reset + recurrent state + decorrelation: the action server (state in main) matches serial."""
    kwargs = dict(batch_B=4, batch_T=9, seed=3, reset_mode="wait_reset", max_decorrelation_steps=6)
    factory = StairsFactory(length=5)
    with make_collector("serial", factory, counter_policy(), **kwargs) as serial:
        expected = [serial.collect() for _ in range(3)]
    with make_collector("action_server", factory, counter_policy(), n_workers=2, **kwargs) as c:
        got = [c.collect() for _ in range(3)]
    for a, b in zip(expected, got, strict=True):
        _assert_same(a, b)
    mask = got[0]["collector", "mask"]
    assert not mask.all() and mask[:, 0].all()
    # Episodes (length 5) all end within the first batch (T=9), so batch 2 starts fresh everywhere: the state
    # read at each valid step counts the steps since the episode began, and idle steps are zeros.
    second_mask = got[1]["collector", "mask"]
    h = got[1]["recurrent_state", "h"][..., 0]
    assert got[1]["is_init"][:, 0].all()
    assert torch.equal(h[second_mask], got[1]["observation"][..., 0][second_mask])
    assert h[~second_mask].eq(0).all()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["serial", "parallel", "alternating"])
def test_policy_sees_global_env_index(kind):
    """A policy reading ("collector", "env_index") gets each env's global index, whichever process runs it."""
    with make_collector(kind, StairsFactory(), env_index_policy(), batch_B=4, batch_T=3, n_workers=2) as c:
        batch = c.collect()
    assert torch.equal(batch["seen_env_index"], torch.arange(4)[:, None].expand(4, 3))
    assert torch.equal(batch["action"], batch["seen_env_index"] % 2)


@pytest.mark.timeout(90)
def test_parallel_workers_use_weights_updated_in_main():
    policy = TensorDictModule(ConstantAction(0), ["observation"], ["action"])
    with make_collector("parallel", StairsFactory(), policy, batch_B=4, batch_T=6, n_workers=2) as c:
        assert c.collect()["action"].eq(0).all()
        with torch.no_grad():
            policy.module.value.fill_(1.0)  # a trainer's optimizer step, in the main process
        assert c.collect()["action"].eq(1).all()
        # Explicit weights are loaded into the policy and reach the workers too.
        c.update_policy_weights_(TensorDictModule(ConstantAction(0), ["observation"], ["action"]).state_dict())
        assert c.collect()["action"].eq(0).all()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["parallel", "action_server"])
def test_greedy_context_reaches_workers(kind):
    from torch.distributions import Categorical
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.modules import ProbabilisticActor

    torch.manual_seed(0)
    actor = ProbabilisticActor(TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["logits"]),
                               in_keys=["logits"], distribution_class=Categorical, return_log_prob=True)
    with make_collector(kind, EnvFactory("CartPole-v1"), actor, batch_B=4, batch_T=30, n_workers=2) as c:
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            greedy = c.collect()
        sampled = c.collect()
    assert torch.equal(greedy["action"], greedy["logits"].argmax(-1))
    assert not torch.equal(sampled["action"], sampled["logits"].argmax(-1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["parallel", "action_server"])
def test_raising_env_surfaces_with_worker_and_traceback(kind):
    policy = mlp_policy(2, 2, discrete=True)
    c = make_collector(kind, StairsFactory(length=4, fail_at=30), policy, batch_B=4, batch_T=50, n_workers=2)
    pids = c.engine.pool.pids
    start = time.monotonic()
    with pytest.raises(CollectorError) as info:
        c.collect()
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "collector worker 0" in message or "collector worker 1" in message
    assert "ValueError: StairsEnv exploded at step 30" in message and "Traceback" in message
    _assert_no_orphans(pids)
    c.shutdown()
    c.shutdown()


@pytest.mark.timeout(60)
def test_worker_killed_mid_batch_raises_within_5s():
    c = make_collector("parallel", SuicideFactory(at=40), None, batch_B=4, batch_T=1000, n_workers=2)
    pids = c.engine.pool.pids
    start = time.monotonic()
    with pytest.raises(CollectorError, match=r"collector worker \d \(pid \d+\) died with exit code -9 \(SIGKILL\)"):
        c.collect()
    assert time.monotonic() - start < 5
    _assert_no_orphans(pids)


@pytest.mark.timeout(60)
def test_action_server_worker_killed_between_batches():
    policy = mlp_policy(4, 2, discrete=True)
    c = make_collector("action_server", EnvFactory("CartPole-v1"), policy, batch_B=4, batch_T=20, n_workers=2)
    c.collect()
    pids = c.engine.pool.pids
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(CollectorError, match="collector worker 1"):
        c.collect()
    assert time.monotonic() - start < 5
    _assert_no_orphans(pids)
    with pytest.raises(RuntimeError, match="shut down"):
        c.collect()


MAIN_SCRIPT = """
import sys, time
sys.path.insert(0, {helpers!r})
from collect_helpers import StairsFactory
from tdrl.collect import ParallelCollector
if __name__ == "__main__":
    c = ParallelCollector(StairsFactory(), None, batch_B=4, batch_T=10, n_workers=2)
    c.collect()
    print(*c.engine.pool.pids, flush=True)
    time.sleep(120)
"""


@pytest.mark.timeout(90)
def test_workers_exit_when_main_process_is_killed(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "main.py"
    script.write_text(MAIN_SCRIPT.format(helpers=os.path.dirname(__file__)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)


@pytest.mark.timeout(60)
def test_action_server_policy_error_shuts_down_cleanly():
    class Boom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, obs):
            self.calls += 1
            if self.calls > 12:  # the build-time checks call it too
                raise RuntimeError("policy exploded")
            return torch.zeros(obs.shape[0], dtype=torch.long)

    c = make_collector("action_server", StairsFactory(), TensorDictModule(Boom(), ["observation"], ["action"]),
                       batch_B=4, batch_T=20, n_workers=2)
    pids = c.engine.pool.pids
    with pytest.raises(RuntimeError, match="policy exploded"):
        c.collect()
    _assert_no_orphans(pids)


@pytest.mark.timeout(60)
def test_env_failing_during_startup_raises_collector_error():
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(CollectorError, match="(?s)collector worker \\d.*StairsEnv exploded at step 1"):
        make_collector("parallel", StairsFactory(fail_at=1), None, batch_B=4, batch_T=5, n_workers=2,
                       max_decorrelation_steps=3, seed=1)
    time.sleep(0.2)
    assert not [p for p in multiprocessing.active_children() if p.pid not in before and p.name.startswith("tdrl")]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_action_server_with_policy_on_gpu():
    policy = mlp_policy(4, 2, discrete=True).to("cuda")
    with make_collector("action_server", EnvFactory("CartPole-v1"), policy, batch_B=8, batch_T=32, n_workers=2,
                        device="cuda") as c:
        batch = c.collect()
    assert batch.device.type == "cuda" and batch["action"].dtype == torch.int64
    assert batch["next", "reward"].eq(1).all()


EARLY_START_SCRIPT = """
import os
from multiprocessing import forkserver
from tdrl.collect import start_workers_early
start_workers_early("serial")
start_workers_early("torchrl")
assert forkserver._forkserver._forkserver_pid is None, "an in-process kind started a server"
start_workers_early("parallel")
pid = forkserver._forkserver._forkserver_pid
os.kill(pid, 0)  # alive: it imports torch now, before any collector exists
print(pid)
"""


def test_start_workers_early_starts_the_fork_server_only_for_worker_kinds():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", EARLY_START_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server exits with the process that started it: no orphan
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"fork server {pid} outlived its process")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["parallel", "action_server"])
def test_acting_model_gives_serial_batches_and_follows_weight_updates(kind):
    """A tdrl model (called through act() in the workers or the server) reproduces the serial batches (the same
    actions and env data; logits up to float rounding, as matmuls over B/W rows round differently), and an in-place
    weight update in the main process reaches the next batch."""
    from tdrl.models import make_actor_critic

    torch.manual_seed(0)
    greedy = make_actor_critic(EnvFactory("CartPole-v1").specs()).greedy
    kwargs = dict(batch_B=4, batch_T=30, seed=3, exploration_type="deterministic")
    with make_collector("serial", EnvFactory("CartPole-v1"), greedy, **kwargs) as serial:
        expected = serial.collect()
    with make_collector(kind, EnvFactory("CartPole-v1"), greedy, n_workers=2, **kwargs) as c:
        got = c.collect()
        for key in expected.keys(True, True):
            if key in ("logits", "action_log_prob"):
                torch.testing.assert_close(got[key], expected[key])
            else:
                assert torch.equal(got[key], expected[key]), key
        with torch.no_grad():
            for p in greedy.parameters():
                p.zero_()  # logits all 0: the greedy action is 0 everywhere
        assert c.collect()["action"].eq(0).all()
