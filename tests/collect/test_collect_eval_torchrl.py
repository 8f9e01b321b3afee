"""Evaluation collector and the TorchRL adapter."""

from __future__ import annotations

import pytest
import torch
from collect_helpers import StairsFactory, mlp_policy, stairs_return
from tensordict.nn import TensorDictModule
from torch.distributions import Categorical
from torchrl.modules import ProbabilisticActor

from tdrl.collect import EvalCollector, make_collector
from tdrl.envs import EnvFactory

pytestmark = pytest.mark.timeout(120)


def test_eval_max_steps_drops_unfinished_episodes():
    discount = 0.9
    with EvalCollector(StairsFactory(length=4), None, n_envs=3, max_steps=30, discount=discount) as ev:
        infos = ev.evaluate()  # 10 steps per env: 2 finished episodes each, the third is cut off
        assert len(infos) == 6
        ret, disc, nonzero = stairs_return(4, discount)
        assert all(i == pytest.approx({"Length": 4, "Return": ret, "NonzeroRewards": nonzero,
                                       "DiscountedReturn": disc}) for i in infos)
        assert ev.evaluate() == infos  # every evaluation starts from fresh episodes
        assert ev.traj_infos == infos


def test_eval_max_trajectories_stops_early():
    with EvalCollector(StairsFactory(length=4), None, n_envs=3, max_steps=3000, max_trajectories=4) as ev:
        assert len(ev.evaluate()) == 4


def test_eval_runs_greedy_policy_and_warns_on_short_budget():
    torch.manual_seed(0)
    actor = ProbabilisticActor(TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["logits"]),
                               in_keys=["logits"], distribution_class=Categorical)
    with pytest.warns(UserWarning, match="over-represented"):
        ev = EvalCollector(EnvFactory("CartPole-v1"), actor, n_envs=2, max_steps=200)
    with ev:
        first = ev.evaluate()
    with EvalCollector(EnvFactory("CartPole-v1"), actor, n_envs=2, max_steps=2000, seed=1) as ev2:
        greedy = ev2.evaluate()
    with EvalCollector(EnvFactory("CartPole-v1"), actor, n_envs=2, max_steps=2000, seed=1) as ev3:
        assert ev3.evaluate() == greedy  # deterministic policy + same seed: same episodes
    assert greedy and all(i["Length"] <= 500 for i in greedy)
    assert isinstance(first, list)
    with pytest.raises(ValueError, match="max_steps"):
        EvalCollector(StairsFactory(), None, n_envs=4, max_steps=2)


@pytest.mark.timeout(180)
def test_torchrl_adapter_layout_and_traj_infos():
    policy = mlp_policy(4, 2, discrete=True)
    with make_collector("torchrl", EnvFactory("CartPole-v1"), policy, batch_B=4, batch_T=50, n_workers=1,
                        total_frames=400) as c:
        batches = list(c)
        infos = c.traj_infos
    assert len(batches) == 2
    b = batches[0]
    assert b.batch_size == (4, 50)
    assert b["next", "reward"].shape == (4, 50, 1) and b["next", "done"].dtype == torch.bool
    assert b["action"].dtype == torch.int64 and b["collector", "mask"].all()
    assert len(infos) == int(batches[-1]["next", "done"].sum())
    with pytest.raises(ValueError, match="wait_reset"):
        make_collector("torchrl", EnvFactory("CartPole-v1"), policy, batch_B=2, batch_T=5, reset_mode="wait_reset")
