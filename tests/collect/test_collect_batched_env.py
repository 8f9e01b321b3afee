"""collector.kind=batched_env on real VMAS scenarios (tdrl.envs.vmas): the grouped layout and its values beside
TorchRL's own VmasEnv stepped by hand, seeding, resets across batch boundaries, exact state round trips, the
evaluator, and the one-line errors of a wrong kind/env pairing."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdrl.collect import make_collector, make_eval_collector
from tdrl.collect.stepping import env_seed
from tdrl.envs import EnvError, EnvFactory
from tdrl.utils.errors import UserError

pytest.importorskip("vmas")

BALANCE = EnvFactory("vmas/balance")


def _policy() -> TensorDictModule:
    """A fixed deterministic policy of balance's agents (16 observations -> 2 forces in [-1, 1])."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 2), torch.nn.Tanh())
    return TensorDictModule(net, in_keys=[("agent", "observation")], out_keys=[("agent", "action")])


def _assert_same(a, b):
    assert a.batch_size == b.batch_size and set(a.keys(True, True)) == set(b.keys(True, True))
    diff = [k for k in a.keys(True, True) if not torch.equal(a.get(k), b.get(k))]
    assert not diff, f"keys differ: {diff}"


def _collect(collector, n):
    out = []
    for _ in range(n):
        out.append((collector.collect(), collector.traj_infos))
    return out


@pytest.mark.timeout(60)
def test_balance_batch_against_torchrl_vmas_env():
    """Keys, shapes and flags of the grouped layout; every observation and reward as TorchRL's VmasEnv, seeded
    alike and stepped by hand with the batch's actions, gives them (with its partial resets at dones)."""
    from torchrl.envs.libs.vmas import VmasEnv

    B, T = 4, 60
    torch.manual_seed(0)  # the random actions (whose packages fall within T steps)
    with make_collector("batched_env", BALANCE, None, batch_B=B, batch_T=T, seed=3) as c:
        batch = c.collect()
        infos = c.traj_infos
    shapes = {("agent", "observation"): (B, T, 3, 16), ("agent", "action"): (B, T, 3, 2), ("agent", "mask"): (B, T, 3),
              ("next", "agent", "observation"): (B, T, 3, 16), ("next", "agent", "reward"): (B, T, 3, 1),
              ("next", "agent", "done"): (B, T, 3, 1), ("next", "agent", "terminated"): (B, T, 3, 1),
              ("next", "agent", "truncated"): (B, T, 3, 1), ("next", "reward"): (B, T, 1), ("next", "done"): (B, T, 1),
              ("next", "terminated"): (B, T, 1), ("next", "truncated"): (B, T, 1), "is_init": (B, T, 1),
              ("collector", "traj_ids"): (B, T), ("collector", "mask"): (B, T)}
    assert {k: tuple(batch.get(k).shape) for k in shapes} == shapes
    assert batch.get("agent").batch_size == (B, T, 3) and batch["agent", "mask"].all()
    torch.testing.assert_close(batch["next", "reward"], batch["next", "agent", "reward"].sum(-2))
    for flag in ("done", "terminated", "truncated"):
        assert torch.equal(batch["next", "agent", flag], batch["next", flag].unsqueeze(-2).expand(B, T, 3, 1))
    done = batch["next", "done"][..., 0]
    assert done.any() and not batch["next", "truncated"].any()  # balance's package fell before the 100-step limit
    assert batch["is_init"][:, 0].all() and torch.equal(batch["is_init"][:, 1:, 0], done[:, :-1])
    assert len(infos) == int(done.sum())
    assert all(info["agent/Return"] == pytest.approx(info["Return"], rel=1e-5) for info in infos)

    env = VmasEnv("balance", num_envs=B, seed=0, group_map={"agent": ["agent_0", "agent_1", "agent_2"]})
    env.set_seed(env_seed(3, 0))
    td = env.reset()
    for t in range(T):
        torch.testing.assert_close(batch["agent", "observation"][:, t], td["agent", "observation"], rtol=0, atol=0)
        td["agent", "action"] = batch["agent", "action"][:, t]
        out = env.step(td)["next"]
        torch.testing.assert_close(batch["next", "agent", "observation"][:, t], out["agent", "observation"],
                                   rtol=0, atol=0)
        torch.testing.assert_close(batch["next", "agent", "reward"][:, t], out["agent", "reward"], rtol=0, atol=0)
        assert torch.equal(batch["next", "terminated"][:, t], out["terminated"])
        td = out.select(("agent", "observation"))
        if out["done"].any():  # the reset rows of a partial reset (TorchRL fills the other rows as it likes)
            reset = env.reset(TensorDict({"_reset": out["done"]}, [B]))["agent", "observation"]
            td["agent", "observation"] = torch.where(out["done"][..., None], reset, td["agent", "observation"])


@pytest.mark.timeout(60)
def test_same_batches_as_torchrl_collector():
    """TorchRL's Collector over a VmasEnv seeded as tdrl seeds its env, with the same deterministic policy, plays the
    same episodes: the same observations, actions, rewards and dones, resets included."""
    from tensordict.nn import InteractionType
    from torchrl.collectors import Collector
    from torchrl.envs.libs.vmas import VmasEnv

    B, T = 3, 40
    policy = _policy()
    with make_collector("batched_env", BALANCE, policy, batch_B=B, batch_T=T, seed=4,
                        exploration_type="deterministic") as c:
        ours = torch.cat([c.collect() for _ in range(2)], dim=1)
    env = VmasEnv("balance", num_envs=B, seed=0, group_map={"agent": ["agent_0", "agent_1", "agent_2"]})
    env.set_seed(env_seed(4, 0))
    collector = Collector(env, policy, frames_per_batch=B * T, total_frames=2 * B * T,
                          exploration_type=InteractionType.DETERMINISTIC, auto_register_policy_transforms=False)
    theirs = torch.cat([batch.reshape(B, T) for batch in collector], dim=1)
    collector.shutdown()
    assert ours["next", "done"].any()
    for key in [("agent", "observation"), ("agent", "action"), ("next", "agent", "observation"),
                ("next", "agent", "reward"), ("next", "done"), ("next", "terminated")]:
        assert torch.equal(ours.get(key), theirs.get(key)), key


@pytest.mark.timeout(60)
def test_same_seed_same_batches_and_callers_rng_untouched():
    """Two collectors seeded alike yield the same batches (the policy deterministic), another seed others; VMAS
    draws from its own random state, never from the caller's generator."""
    kwargs = dict(batch_B=3, batch_T=20, seed=11)
    with make_collector("batched_env", BALANCE, _policy(), **kwargs) as c:
        first = [batch.clone() for batch, _ in _collect(c, 2)]
    with make_collector("batched_env", BALANCE, _policy(), **kwargs) as c:
        state = torch.get_rng_state()
        second = [batch for batch, _ in _collect(c, 2)]
        assert torch.equal(torch.get_rng_state(), state)
    for a, b in zip(first, second, strict=True):
        _assert_same(a, b)
    with make_collector("batched_env", BALANCE, _policy(), **{**kwargs, "seed": 12}) as c:
        other = c.collect()
    assert not torch.equal(other["agent", "observation"][:, 0], first[0]["agent", "observation"][:, 0])


@pytest.mark.timeout(60)
def test_resets_across_batch_boundaries():
    """7-step episodes in 5-step batches: truncated (not terminated) at the limit, reset at once, episode ids and
    TrajInfo lengths running across the boundaries."""
    factory = EnvFactory("vmas/balance", {"max_episode_steps": 7})
    with make_collector("batched_env", factory, _policy(), batch_B=2, batch_T=5, seed=0) as c:
        batches = _collect(c, 4)
    batch = torch.cat([b for b, _ in batches], dim=1)
    done, truncated = batch["next", "done"][..., 0], batch["next", "truncated"][..., 0]
    assert truncated.any() and torch.equal(truncated, done & ~batch["next", "terminated"][..., 0])
    ends = []  # (t, env, length) of every episode the batches finished
    for i in range(2):
        start, episode = 0, 0
        for t in range(20):
            assert batch["collector", "traj_ids"][i, t] == 2 * episode + i
            assert bool(batch["is_init"][i, t, 0]) == (t == start)
            if done[i, t]:
                ends.append((t, i, t - start + 1))
                assert t - start + 1 == 7 or not truncated[i, t]
                start, episode = t + 1, episode + 1
    lengths = [info["Length"] for _, infos in batches for info in infos]
    assert lengths == [length for _, _, length in sorted(ends)] and any(t % 5 != 4 for t, _, _ in ends)


@pytest.mark.timeout(90)
def test_state_round_trip_is_exact():
    """A collector restored (through torch.save) from another's state continues with the same batches and
    TrajInfos: VMAS's tensors, its random state, the observations and the episodes in progress."""
    kwargs = dict(batch_B=3, batch_T=16, seed=5)
    with make_collector("batched_env", BALANCE, None, **kwargs) as c:
        c.collect()
        buffer = io.BytesIO()
        torch.save(c.state_dict(), buffer)
        torch.manual_seed(9)  # random actions draw from the caller's generator
        expected = [(b.clone(), infos) for b, infos in _collect(c, 4)]
    buffer.seek(0)
    with make_collector("batched_env", BALANCE, None, **kwargs) as c:
        _collect(c, 4)  # moves the fresh collector on, its envs' random state too: the state overwrites all of it
        c.load_state_dict(torch.load(buffer, weights_only=False))
        torch.manual_seed(9)
        got = _collect(c, 4)
    assert sum(len(infos) for _, infos in expected) > 0
    for (a, infos_a), (b, infos_b) in zip(expected, got, strict=True):
        _assert_same(a, b)
        assert infos_a == infos_b


@pytest.mark.timeout(60)
def test_eval_collector_plays_whole_episodes():
    """make_eval_collector on a vmas id: one wait-reset batch of n_envs whole episodes per evaluation, the steps
    after an episode's end zeroed and masked, fresh episodes the next time."""
    evaluator = make_eval_collector("vmas/balance", _policy(), n_envs=3, max_steps=12, seed=1)
    first = evaluator.evaluate()
    second = evaluator.evaluate()
    batch = evaluator.collector.engine.buffer  # the second evaluation's
    evaluator.shutdown()
    assert len(first) == len(second) == 3 and all(1 <= info["Length"] <= 12 for info in first + second)
    valid = batch["collector", "mask"]
    assert sorted(valid.sum(1).tolist()) == sorted(info["Length"] for info in second)
    returns = batch["next", "reward"][..., 0].sum(1).tolist()
    assert sorted(returns) == pytest.approx(sorted(info["Return"] for info in second))
    assert (batch["next", "reward"][~valid] == 0).all() and batch["is_init"][:, 0].all()
    assert first != second  # the envs' streams go on: new initial states


@pytest.mark.timeout(60)
def test_group_maps_and_a_seeded_factory():
    """group_map=per_agent: a group per agent, whose returns add up to the episode's; EnvFactory(...)(seed=s)
    builds a VMAS env reset with that seed, as reset(seed=s) does."""
    factory = EnvFactory("vmas/balance", {"group_map": "per_agent", "max_episode_steps": 10})
    with make_collector("batched_env", factory, None, batch_B=2, batch_T=25, seed=2) as c:
        batch = c.collect()
        infos = c.traj_infos
    assert {key for key in batch.keys() if key.startswith("agent")} == {"agent_0", "agent_1", "agent_2"}
    assert batch.get("agent_1").batch_size == (2, 25, 1) and len(infos) >= 4
    for info in infos:
        assert sum(info[f"agent_{i}/Return"] for i in range(3)) == pytest.approx(info["Return"], rel=1e-5)
    seeded = EnvFactory("vmas/balance", {"num_envs": 2})
    envs = [seeded(seed=7), seeded(), seeded(seed=8)]
    envs[1].reset(seed=7)
    action = {("agent", "action"): torch.full((2, 3, 2), 0.5)}
    same, reset_alike, other = (env.step(action)["agent", "observation"] for env in envs)
    assert torch.equal(same, reset_alike) and not torch.equal(same, other)


def test_wrong_kind_and_env_pairings_are_one_line_errors():
    with pytest.raises(UserError, match=r"collector.kind=batched_env steps batched torch envs .*'CartPole-v1' is a "
                                        "gymnasium env"):
        make_collector("batched_env", EnvFactory("CartPole-v1"), None, batch_B=2, batch_T=2)
    for kind in ("serial", "parallel", "torchrl"):
        with pytest.raises(UserError, match=f"'vmas/balance' is a batched torch env .* collector.kind=batched_env, "
                                            f"not {kind}"):
            make_collector(kind, BALANCE, None, batch_B=2, batch_T=2, n_workers=1)
    with pytest.raises(EnvError, match=r"^unknown environment id 'vmas/balanc'; did you mean vmas/balance\?$"):
        EnvFactory("vmas/balanc").specs()
    with pytest.raises(UserError, match="takes no transform"):
        from torchrl.envs import RewardScaling

        make_collector("batched_env", BALANCE, None, batch_B=2, batch_T=2, transform=RewardScaling(0.0, 1.0))
    with pytest.raises(UserError, match="is a batched torch env, not filmed yet"):
        make_eval_collector("vmas/balance", None, n_envs=1, seed=0, video=True)


def test_missing_vmas_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vmas", None)  # import vmas raises ImportError, as without the package
    with pytest.raises(EnvError, match=r"^environment 'vmas/balance' needs vmas: pip install 'tdrl\[marl\]'$"):
        EnvFactory("vmas/balance").specs()
