"""Evaluation collector and the TorchRL adapter."""

from __future__ import annotations

import pytest
import torch
from collect_helpers import mlp_policy
from torchrl.envs.utils import ExplorationType

from tdrl.collect import make_collector, make_eval_collector
from tdrl.envs import EnvFactory
from tdrl.utils.errors import UserError

pytestmark = pytest.mark.timeout(120)


def test_no_evaluator_without_envs():
    assert make_eval_collector("CartPole-v1", None, n_envs=0, seed=0) is None


def test_eval_runs_one_whole_greedy_episode_per_env():
    from tdrl.models import make_actor_critic

    torch.manual_seed(0)
    greedy = make_actor_critic(EnvFactory("CartPole-v1").specs()).greedy
    with make_eval_collector("CartPole-v1", greedy, n_envs=3, max_steps=15, seed=5, discount=0.9) as ev:
        first, second = ev.evaluate(), ev.evaluate()
        assert ev.traj_infos == second
        assert ev.collector.engine.policy_step.exploration_type is ExplorationType.DETERMINISTIC
    for infos in (first, second):
        assert len(infos) == 3 and all(1 <= i["Length"] <= 15 for i in infos)
        assert all(i["DiscountedReturn"] == pytest.approx(sum(0.9**k for k in range(i["Length"]))) for i in infos)
    assert first != second  # each env continues its own random stream: new initial states
    with make_eval_collector("CartPole-v1", greedy, n_envs=3, max_steps=15, seed=5, discount=0.9) as again:
        assert again.evaluate() == first  # same seed, deterministic policy: the same episodes
    with make_eval_collector("CartPole-v1", greedy, n_envs=1, seed=5) as own_limit:
        assert own_limit.collector.batch_T == 500  # CartPole-v1's own time limit


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
    with pytest.raises(UserError, match="wait_reset"):
        make_collector("torchrl", EnvFactory("CartPole-v1"), policy, batch_B=2, batch_T=5, reset_mode="wait_reset")


def test_torchrl_adapter_refuses_a_recurrent_policy_in_one_line():
    from tdrl.models import make_recurrent_actor_critic

    recurrent = make_recurrent_actor_critic(EnvFactory("CartPole-v1").specs(), lstm_size=8).actor
    with pytest.raises(UserError, match="feed-forward policies only"):
        make_collector("torchrl", EnvFactory("CartPole-v1"), recurrent, batch_B=2, batch_T=5, n_workers=1)
