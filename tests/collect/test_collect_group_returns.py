"""Each agent group's episode return in the TrajInfos (``"<group>/Return"``, logged as ``train/<group>/return_mean``)
from every collector kind that steps grouped envs, across decorrelation, wait-reset and a state round trip."""

from __future__ import annotations

import numpy as np
import pytest
from grouped_helpers import LeavingFactory, group_policy
from tensordict.nn import TensorDictSequential

from tdrl.collect import make_collector
from tdrl.collect.traj_info import EpisodeTracker
from tdrl.utils.stats import summarize_records

# LeavingEnv: walker_0 earns 1+2+3+4, walker_1 (leaves after step 2) 11+12, scout_0 (after step 3) 21+22+23
EPISODE = {"walker/Return": 10.0 + 23.0, "scout/Return": 66.0, "Return": 99.0, "Length": 4}


def _policy() -> TensorDictSequential:
    return TensorDictSequential(group_policy("walker", 2, 2), group_policy("scout", 2, 2))


def _episodes(collector, batches: int) -> list[dict[str, float]]:
    out = []
    for _ in range(batches):
        collector.collect()
        out += collector.traj_infos
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("kind", "options"), [
    ("serial", {}), ("serial", {"reset_mode": "wait_reset"}), ("parallel", {"n_workers": 2}),
    ("action_server", {"n_workers": 2}), ("alternating", {"n_workers": 2}),
], ids=["serial", "serial-wait-reset", "parallel", "action_server", "alternating"])
def test_group_returns_of_each_kind(kind, options):
    """Every finished episode, the first ones' decorrelation steps included, has each group's return and they add
    up to the summed one."""
    with make_collector(kind, LeavingFactory(), _policy(), batch_B=4, batch_T=7, seed=2, max_decorrelation_steps=3,
                        **options) as c:
        episodes = _episodes(c, 3)
    assert len(episodes) >= 8
    assert all({k: e[k] for k in EPISODE} == EPISODE for e in episodes), episodes
    row = summarize_records(episodes)
    assert (row["train/walker/return_mean"], row["train/scout/return_mean"]) == (33.0, 66.0)


@pytest.mark.timeout(60)
def test_group_returns_resume_mid_episode():
    """A collector restored between batches finishes the episodes in progress with their groups' partial sums."""
    kwargs = dict(batch_B=2, batch_T=3, seed=0)
    with make_collector("serial", LeavingFactory(), _policy(), **kwargs) as c:
        c.collect()
        state = c.state_dict()
        expected = _episodes(c, 3)
    with make_collector("serial", LeavingFactory(), _policy(), **kwargs) as c:
        c.load_state_dict(state)
        got = _episodes(c, 3)
    assert got == expected and len(got) == 6 and all({k: e[k] for k in EPISODE} == EPISODE for e in got)


@pytest.mark.parametrize("k", [3, 40], ids=["stepwise", "prefix-sums"])
def test_tracker_group_returns_add_up(k):
    """Random rewards split between two groups, random dones and wait-reset masks, on both of the tracker's paths:
    each episode's group returns add up to its return; a block without the groups' rewards is refused."""
    rng = np.random.default_rng(k)
    tracker = EpisodeTracker(4, 0.9, groups=["red", "blue"])
    n_episodes = 0
    for _ in range(30):
        red, blue = rng.normal(size=(2, 4, k))
        dones = rng.random((4, k)) < 0.2
        valid = np.cumsum(dones, 1) - dones == 0 if rng.random() < 0.3 else None
        for _, _, info in tracker.add(red + blue, dones, valid, group_rewards={"red": red, "blue": blue}):
            assert info["red/Return"] + info["blue/Return"] == pytest.approx(info["Return"], abs=1e-9)
            n_episodes += 1
    assert n_episodes > 20
    with pytest.raises(ValueError, match=r"this tracker's groups are \['red', 'blue'\]; add\(\) got rewards for None"):
        tracker.add(red + blue, dones)
