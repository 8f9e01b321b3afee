"""Collector state: a collector rebuilt with the same arguments and loaded continues bitwise as the saved one.

Real gymnasium envs (CartPole, Pendulum) and real worker processes; episodes are mid-way at every save point.
The main process's torch RNG is restored around the load as the trainer's ``Run`` does.
"""

from __future__ import annotations

import io
import os
import signal
import time
import warnings

import pytest
import torch
from collect_helpers import StairsFactory, mlp_policy

from tdrl.collect import CollectorError, make_collector, make_eval_collector
from tdrl.envs import EnvFactory
from tdrl.models.policies import make_actor_critic, make_recurrent_actor_critic

CARTPOLE = EnvFactory("CartPole-v1")
PENDULUM = EnvFactory("Pendulum-v1", {"max_episode_steps": 25})  # episodes end within the batches compared


def deterministic_mlp():
    return CARTPOLE, mlp_policy(4, 2, discrete=True), 4  # its episodes last 8-11 steps


def stochastic_gaussian():
    torch.manual_seed(1)
    return PENDULUM, make_actor_critic(PENDULUM.specs(), hidden_sizes=(32,)).actor, 10


def stochastic_lstm():
    torch.manual_seed(2)
    return CARTPOLE, make_recurrent_actor_critic(CARTPOLE.specs(), hidden_sizes=(16,), lstm_size=16).actor, 5


POLICIES = {"mlp": deterministic_mlp, "gaussian": stochastic_gaussian, "lstm": stochastic_lstm}

# Every kind with every policy; each kind sees both reset modes and runs with and without decorrelation.
CASES = [
    ("serial", "mlp", "reset_at_once", 0), ("serial", "gaussian", "wait_reset", 9),
    ("serial", "lstm", "reset_at_once", 5),
    ("parallel", "mlp", "wait_reset", 5), ("parallel", "gaussian", "reset_at_once", 0),
    ("parallel", "lstm", "wait_reset", 0),
    ("action_server", "mlp", "reset_at_once", 9), ("action_server", "gaussian", "wait_reset", 0),
    ("action_server", "lstm", "reset_at_once", 0),
    ("alternating", "mlp", "wait_reset", 0), ("alternating", "gaussian", "reset_at_once", 5),
    ("alternating", "lstm", "wait_reset", 5),
]


def build(kind, factory, policy, batch_T, **kwargs):
    n_workers = 1 if kind == "alternating" else 2
    return make_collector(kind, factory, policy, batch_B=4, batch_T=batch_T, n_workers=n_workers, seed=3, **kwargs)


def through_torch_save(state):
    """What a checkpoint holds: the state after ``torch.save``/``torch.load``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def in_progress(state) -> tuple[int, int]:
    """(envs mid-episode, their summed episode lengths) at the save point."""
    slices = [s["envs"] for s in state["engine"]["slices"]]
    mid = sum(int((~s["is_init"]).sum()) for s in slices)
    return mid, sum(int(s["episodes"]["length"].sum()) for s in slices)


def assert_same_batches(got, expected):
    for (batch, infos), (batch_e, infos_e) in zip(got, expected, strict=True):
        assert set(batch.keys(True, True)) == set(batch_e.keys(True, True))
        for key in batch_e.keys(True, True):
            assert torch.equal(batch.get(key), batch_e.get(key)), key
        assert infos == infos_e


@pytest.mark.parametrize("kind,policy_name,reset_mode,decorrelation", CASES)
def test_loaded_collector_continues_bitwise(kind, policy_name, reset_mode, decorrelation):
    kwargs = dict(reset_mode=reset_mode, max_decorrelation_steps=decorrelation)
    factory, policy, batch_T = POLICIES[policy_name]()
    with build(kind, factory, policy, batch_T, **kwargs) as saved:
        for _ in range(2):
            saved.collect()
        state = through_torch_save(saved.state_dict())
        rng = torch.get_rng_state()
        expected = []
        for _ in range(4):
            expected.append((saved.collect(), saved.traj_infos))
    mid, length = in_progress(state)
    assert mid > 0 and length > 0, "the save point must fall mid-episode"
    assert any(infos for _, infos in expected), "episodes must finish after the save point"
    assert (state["frames"], state["iter"]) == (2 * 4 * batch_T, 2)

    factory, policy, batch_T = POLICIES[policy_name]()  # the same weights, as a resumed run rebuilds them
    with build(kind, factory, policy, batch_T, **kwargs) as loaded:
        loaded.load_state_dict(state)
        torch.set_rng_state(rng)  # the trainer's Run restores the main process's RNG after the load
        got = [(loaded.collect(), loaded.traj_infos) for _ in range(4)]
        assert loaded.frames == 6 * 4 * batch_T
    assert_same_batches(got, expected)


@pytest.mark.parametrize("env_id,module", [("Hopper-v5", "mujoco"), ("ALE/Pong-v5", "ale_py"),
                                           ("MinAtar/Breakout-v1", "minatar")])
def test_mujoco_and_atari_collectors_continue_bitwise(env_id, module):
    """The other env families through the collectors (random actions: the action spaces' RNGs are env state)."""
    pytest.importorskip(module)
    factory = EnvFactory(env_id)
    kwargs = dict(reset_mode="wait_reset", max_decorrelation_steps=30)
    with build("serial", factory, None, 10, **kwargs) as saved:
        saved.collect()
        state = through_torch_save(saved.state_dict())
        expected = [(saved.collect(), saved.traj_infos) for _ in range(2)]
    assert in_progress(state)[0] > 0
    with build("serial", factory, None, 10, **kwargs) as loaded:
        loaded.load_state_dict(state)
        assert_same_batches([(loaded.collect(), loaded.traj_infos) for _ in range(2)], expected)


@pytest.mark.parametrize("policy_name", ["gaussian", "lstm"])
def test_building_a_collector_draws_nothing_from_the_callers_rng(policy_name):
    """So a resumed run may restore its RNG before or after building its collectors (the async one does before)."""
    factory, policy, batch_T = POLICIES[policy_name]()
    before = torch.get_rng_state()
    with build("serial", factory, policy, batch_T):
        assert torch.equal(torch.get_rng_state(), before)


def test_eval_collector_resumes_its_episodes():
    policy = mlp_policy(3, 1, discrete=False)
    evaluator = make_eval_collector("Pendulum-v1", policy, n_envs=2, max_steps=20, seed=11)
    with evaluator:
        first = evaluator.evaluate()
        state = through_torch_save(evaluator.state_dict())
        expected = [evaluator.evaluate() for _ in range(2)]
    assert expected[0] != first  # the envs' streams moved on: a fresh evaluator would replay `first`
    loaded = make_eval_collector("Pendulum-v1", policy, n_envs=2, max_steps=20, seed=11)
    with loaded:
        loaded.load_state_dict(state)
        assert [loaded.evaluate() for _ in range(2)] == expected


def test_dead_worker_during_state_dict_raises_within_seconds():
    with build("parallel", CARTPOLE, mlp_policy(4, 2, discrete=True), 5) as collector:
        collector.collect()
        os.kill(collector.engine.pool.pids[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(CollectorError, match="worker 1"):
            collector.state_dict()
        assert time.monotonic() - start < 5


def test_state_of_another_layout_is_refused():
    with build("serial", CARTPOLE, None, 5) as collector:
        state = collector.state_dict()
    with make_collector("serial", CARTPOLE, None, batch_B=2, batch_T=5) as other:
        with pytest.raises(ValueError, match="same batch_B"):
            other.load_state_dict(state)


def test_uncapturable_env_warns_at_build_and_restarts_its_episode():
    factory = StairsFactory(length=5)
    with pytest.warns(UserWarning, match="StairsEnv"):
        saved = make_collector("serial", factory, None, batch_B=2, batch_T=3, seed=1)
    with saved:
        saved.collect()
        state = saved.state_dict()
    assert state["engine"]["slices"][0]["envs"]["envs"] == [None, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = make_collector("serial", factory, None, batch_B=2, batch_T=3, seed=1)
        loaded = make_collector("serial", factory, None, batch_B=2, batch_T=3, seed=1)
    with fresh, loaded:
        loaded.load_state_dict(state)
        batch, batch_fresh = loaded.collect(), fresh.collect()
    assert torch.equal(batch["observation"], batch_fresh["observation"])  # fresh episodes, as documented
    assert torch.equal(batch["collector", "traj_ids"], batch_fresh["collector", "traj_ids"])  # none finished yet


def test_torchrl_kind_says_it_does_not_capture():
    with pytest.warns(UserWarning, match="does not checkpoint"):
        collector = make_collector("torchrl", CARTPOLE, mlp_policy(4, 2, discrete=True), batch_B=2, batch_T=4,
                                   n_workers=1)
    with collector:
        collector.collect()
        state = collector.state_dict()
    assert state["engine"]["captured"] is False and state["frames"] == 8
