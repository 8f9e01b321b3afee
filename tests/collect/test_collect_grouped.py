"""Dict observations, action masks and multi-agent groups through tdrl's collectors (docs/design.md §1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from grouped_helpers import (
    LeavingFactory,
    MaskedWalkEnv,
    MaskedWalkFactory,
    TaxiFactory,
    group_policy,
    masked_walk_policy,
)

from tdrl.collect import make_collector
from tdrl.collect.stepping import env_seed
from tdrl.envs import EnvError, EnvFactory
from tdrl.utils.errors import UserError


def _assert_same(a, b):
    assert a.batch_size == b.batch_size
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    diff = [k for k in a.keys(True, True) if not torch.equal(a.get(k), b.get(k))]
    assert not diff, f"keys differ: {diff}"


def _walk_by_hand(batch, seed):
    """Step each env of a MaskedWalk batch by hand with the batch's actions and check every entry."""
    B, T = batch.batch_size
    for i in range(B):
        env = MaskedWalkEnv()
        obs, _ = env.reset(seed=env_seed(seed, i))
        for t in range(T):
            np.testing.assert_array_equal(batch["observation"][i, t].numpy(), obs["observation"])
            np.testing.assert_array_equal(batch["goal", "xy"][i, t].numpy(), obs["goal"]["xy"])
            np.testing.assert_array_equal(batch["action_mask"][i, t].numpy(), obs["action_mask"].astype(bool))
            obs, reward, term, trunc, _ = env.step(int(batch["action"][i, t]))
            np.testing.assert_array_equal(batch["next", "observation"][i, t].numpy(), obs["observation"])
            assert batch["next", "reward"][i, t, 0] == reward
            assert (bool(batch["next", "terminated"][i, t, 0]), bool(batch["next", "truncated"][i, t, 0])) == (term,
                                                                                                               trunc)
            if term or trunc:
                obs, _ = env.reset()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_dict_observation_and_action_mask(kind):
    """Nested dict entries and the bool action mask, each value as stepping the env by hand gives it; the parallel
    kind's batches equal the serial one's."""
    kwargs = dict(batch_B=4, batch_T=12, seed=3)
    with make_collector("serial", MaskedWalkFactory(), masked_walk_policy(), **kwargs) as serial:
        expected = [serial.collect() for _ in range(2)]
    if kind == "parallel":
        with make_collector(kind, MaskedWalkFactory(), masked_walk_policy(), n_workers=2, **kwargs) as c:
            got = [c.collect() for _ in range(2)]
        for a, b in zip(expected, got, strict=True):
            _assert_same(a, b)
    batch = torch.cat(expected, dim=1)
    assert batch["action_mask"].dtype == torch.bool and batch["goal", "xy"].shape == (4, 24, 2)
    assert batch["next", "done"].any() and not batch["action_mask"].all()  # episodes ended, the mask masked
    _walk_by_hand(batch, seed=3)


@pytest.mark.filterwarnings("ignore:the collector cannot checkpoint")
def test_info_action_mask_taxi():
    """Taxi-v4 puts its action mask in info: InfoActionMask moves it into the observation the collector stores."""
    with make_collector("serial", TaxiFactory(), None, batch_B=2, batch_T=20, seed=5) as c:
        batch = c.collect()
    assert batch["observation"].shape == (2, 20) and batch["action_mask"].shape == (2, 20, 6)
    for i in range(2):
        env = TaxiFactory()()
        _, info = env.reset(seed=env_seed(5, i))
        for t in range(20):
            np.testing.assert_array_equal(batch["action_mask"][i, t].numpy(), info["action_mask"].astype(bool))
            _, _, term, trunc, info = env.step(int(batch["action"][i, t]))
            if term or trunc:
                _, info = env.reset()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("factory", ["walk", "mpe2", "lbforaging"])
def test_state_round_trip(factory):
    """A collector restored from another's state_dict continues with the same batches (dict observations, a
    grouped env's captured PettingZoo or lbforaging state and its global state, a Dict action space's RNGs)."""
    if factory == "mpe2":
        pytest.importorskip("mpe2")

        env_factory = EnvFactory("mpe2/simple_spread_v3")
    elif factory == "lbforaging":
        pytest.importorskip("lbforaging")

        env_factory = EnvFactory("lbforaging/Foraging-8x8-2p-2f-coop-v3")
    else:
        env_factory = MaskedWalkFactory()
    kwargs = dict(batch_B=2, batch_T=10, seed=7)
    with make_collector("serial", env_factory, None, **kwargs) as c:
        c.collect()
        state = c.state_dict()
        expected = [c.collect() for _ in range(3)]
    with make_collector("serial", env_factory, None, **kwargs) as c:
        c.load_state_dict(state)
        got = [c.collect() for _ in range(3)]
    for a, b in zip(expected, got, strict=True):
        _assert_same(a, b)


@pytest.mark.timeout(60)
def test_mpe2_simple_spread_parallel():
    """mpe2's simple_spread in worker processes: TorchRL's grouped keys and shapes, 25-step episodes, and the
    serial collector's batches."""
    pytest.importorskip("mpe2")

    factory = EnvFactory("mpe2/simple_spread_v3")
    kwargs = dict(batch_B=4, batch_T=30, seed=1)
    policy = group_policy("agent", 18, 5)
    with make_collector("parallel", factory, policy, n_workers=2, **kwargs) as c:
        got = [c.collect() for _ in range(2)]
    with make_collector("serial", factory, policy, **kwargs) as serial:
        expected = [serial.collect() for _ in range(2)]
    for a, b in zip(expected, got, strict=True):
        _assert_same(a, b)
    batch = got[0]
    assert batch.get("agent").batch_size == (4, 30, 3) and batch.get(("next", "agent")).batch_size == (4, 30, 3)
    shapes = {("agent", "observation"): (4, 30, 3, 18), ("agent", "action"): (4, 30, 3), ("agent", "mask"): (4, 30, 3),
              ("next", "agent", "observation"): (4, 30, 3, 18), ("next", "agent", "reward"): (4, 30, 3, 1),
              ("next", "agent", "done"): (4, 30, 3, 1), ("next", "agent", "truncated"): (4, 30, 3, 1),
              "state": (4, 30, 54), ("next", "reward"): (4, 30, 1), ("next", "done"): (4, 30, 1)}
    assert {k: tuple(batch.get(k).shape) for k in shapes} == shapes
    assert batch["agent", "mask"].all() and batch["agent", "mask"].dtype == torch.bool
    done = batch["next", "done"][..., 0]
    assert done[:, 24].all() and done.sum() == 4  # max_cycles=25
    assert batch["next", "agent", "truncated"][:, 24].all() and not batch["next", "terminated"].any()
    assert batch["is_init"][:, 25].all()
    torch.testing.assert_close(batch["next", "reward"][..., 0], batch["next", "agent", "reward"].sum((-2, -1)))
    obs, action = batch["agent", "observation"], batch["agent", "action"]
    torch.testing.assert_close(action, policy.module(obs))  # each agent's row acted on its own observation


def test_torchrl_kind_refuses_agent_groups():
    with pytest.raises(UserError, match="collector kind 'torchrl' does not step tdrl's multi-agent envs"):
        make_collector("torchrl", LeavingFactory(), None, batch_B=1, batch_T=2, n_workers=1)


def test_agent_leaving_is_masked():
    """An agent that leaves before the episode ends: its final observation under next, then masked, zero
    reward, its done flags kept; the env never gets its action; the episode ends when no agent is left."""
    with make_collector("serial", LeavingFactory(), None, batch_B=1, batch_T=6, seed=0) as c:
        b = c.collect()[0]
    assert b.get("walker").batch_size == (6, 2) and b.get("scout").batch_size == (6, 1)
    assert b["walker", "mask"].tolist() == [[True, True], [True, True], [True, False], [True, False], [True, True],
                                            [True, True]]
    assert b["scout", "mask"][:, 0].tolist() == [True, True, True, False, True, True]
    assert b["next", "walker", "mask"][1].tolist() == [True, False]
    assert b["next", "walker", "observation"][1, 1].tolist() == [2.0, 1.0]  # walker_1's final observation
    assert b["walker", "observation"][2:4, 1].tolist() == [[2.0, 1.0]] * 2  # gone: its final one, masked
    assert b["next", "walker", "terminated"][:4, :, 0].tolist() == [[False, False], [False, True], [False, True],
                                                                    [True, True]]
    assert b["next", "scout", "truncated"][:4, 0, 0].tolist() == [False, False, True, True]
    assert b["next", "walker", "reward"][:4, :, 0].tolist() == [[1, 11], [2, 12], [3, 0], [4, 0]]
    assert b["next", "reward"][:4, 0].tolist() == [1 + 11 + 21, 2 + 12 + 22, 3 + 23, 4]
    assert b["next", "done"][:, 0].tolist() == [False, False, False, True, False, False]
    assert b["next", "truncated"][3, 0] and not b["next", "terminated"][3, 0]  # scout_0 was truncated
    assert b["is_init"][:, 0].tolist() == [True, False, False, False, True, False]
    assert b["state"][:, 0].tolist() == [0, 1, 2, 3, 0, 1]


def test_group_map_errors():
    """A group map naming an agent the env does not have, or leaving one out: one line naming them."""
    with pytest.raises(EnvError, match=r"agents the env does not have: walker_7 \(its agents: walker_0, walker_1, "
                                       r"scout_0\)"):
        LeavingFactory({"walker": ["walker_0", "walker_7"], "scout": ["scout_0"]})()
    with pytest.raises(EnvError, match="leaves agents in no group: walker_1"):
        LeavingFactory({"walker": ["walker_0"], "scout": ["scout_0"]})()
    with pytest.raises(EnvError, match="unknown group_map 'by_team'"):
        LeavingFactory("by_team")()
    env = LeavingFactory("one_group")()
    assert list(env.observation_space.spaces) == ["agents", "state"]


def test_multiagent_ids():
    """mpe2, lbforaging and pettingzoo ids: an unknown one names the known envs; lbforaging's time limit
    truncates; discrete observations per agent."""
    pytest.importorskip("mpe2")
    pytest.importorskip("lbforaging")

    with pytest.raises(EnvError, match="unknown environment id 'mpe2/simple_sprd_v3'; mpe2 has .*simple_spread_v3"):
        EnvFactory("mpe2/simple_sprd_v3")()
    factory = EnvFactory("lbforaging/Foraging-5x5-2p-1f-v3", {"max_episode_steps": 8})
    with make_collector("serial", factory, None, batch_B=2, batch_T=10, seed=0) as c:
        batch = c.collect()
    assert batch["agent", "observation"].shape[:3] == (2, 10, 2)
    ends = batch["next", "done"][..., 0]
    assert ends.any() and (batch["next", "truncated"][..., 0] | batch["next", "terminated"][..., 0]).equal(ends)
    # lbforaging's global state: the agents' observations concatenated (EPyMARL's; QMIX mixes on it)
    assert batch["state"].shape == (2, 10, 2 * batch["agent", "observation"].shape[-1])
    assert batch["state"].equal(batch["agent", "observation"].flatten(-2))
    with make_collector("serial", EnvFactory("pettingzoo/classic/rps_v2"), None, batch_B=1, batch_T=4) as c:
        batch = c.collect()  # Discrete observations per agent: int64 [n]
    assert batch["player", "observation"].shape == (1, 4, 2) and batch["player", "observation"].dtype == torch.int64
