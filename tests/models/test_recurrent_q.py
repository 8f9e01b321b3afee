"""R2D1's recurrent actor in a real collector: prev_action/prev_reward reach the model, are zero after a reset, and
the collector stores them with the state; episodic lives reset the agent but not the game."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tdrl.collect import make_collector
from tdrl.envs import EnvFactory
from tdrl.models import EpsilonGreedy, chain_policy
from tdrl.models.recurrent_q import PreviousAction, make_recurrent_q_actor
from tdrl.utils.keys import RECURRENT_KEYS

KINDS = ["serial", "parallel", "action_server"]


def _policy(specs, eps=0.5):
    torch.manual_seed(0)
    actor = make_recurrent_q_actor(specs, hidden_sizes=[16], lstm_size=8, head_sizes=[16])
    exploration = EpsilonGreedy(specs.n_actions, eps_init=eps, eps_final=eps)
    return actor, chain_policy(actor, exploration, PreviousAction(specs.n_actions))


def test_prev_action_and_prev_reward_change_the_q_values():
    specs = EnvFactory("CartPole-v1").specs()
    actor, _ = _policy(specs)
    obs = torch.randn(3, 4)
    base = actor.act(obs, {}, deterministic=True)["action_value"]
    with_action = actor.act(obs, {"prev_action": F.one_hot(torch.tensor([1, 1, 1]), 2).float()},
                            deterministic=True)["action_value"]
    with_reward = actor.act(obs, {"prev_reward": torch.ones(3, 1)}, deterministic=True)["action_value"]
    assert not torch.allclose(base, with_action) and not torch.allclose(base, with_reward)


@pytest.mark.parametrize("kind", KINDS)
def test_collector_feeds_back_the_executed_action_and_reward(kind):
    factory = EnvFactory("CartPole-v1")
    specs = factory.specs()
    _, policy = _policy(specs)
    with make_collector(kind, factory, policy, batch_B=2, batch_T=60, n_workers=2, seed=0,
                        reset_mode="wait_reset") as collector:
        batches = [collector.collect().clone() for _ in range(2)]
    for batch in batches:
        is_init = batch["is_init"].squeeze(-1)
        mask = batch["collector", "mask"]
        prev_action, prev_reward = batch["prev_action"], batch["prev_reward"].squeeze(-1)
        executed = F.one_hot(batch["action"], 2).float()
        later = ~is_init[:, 1:] & mask[:, 1:]
        assert bool(is_init[:, 0].all()) or batch is batches[1]
        torch.testing.assert_close(prev_action[:, 1:][later], executed[:, :-1][later])
        torch.testing.assert_close(prev_reward[:, 1:][later], batch["next", "reward"].squeeze(-1)[:, :-1][later])
        assert bool((prev_action[is_init] == 0).all()) and bool((prev_reward[is_init] == 0).all())
        for key in RECURRENT_KEYS:
            assert bool((batch[key][is_init] == 0).all()), "the state read at a reset must be zero"
            assert bool((batch[key][~is_init & mask].abs().sum((-1, -2)) > 0).all())
    assert bool(batches[1]["is_init"][:, 0].any()), "CartPole episodes end within 60 random-ish steps"


def test_episodic_lives_reset_the_agent_not_the_game():
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'tdrl[atari]'")
    factory = EnvFactory("ALE/Breakout-v5", {"episodic_lives": True, "repeat_action_probability": 0.0})
    specs = factory.specs()
    _, policy = _policy(specs, eps=1.0)
    with make_collector("serial", factory, policy, batch_B=1, batch_T=100, seed=0,
                        reset_mode="wait_reset") as collector:
        batches = [collector.collect().clone() for _ in range(4)]
    ends = [(i, int(b["next", "terminated"][0, :, 0].nonzero()[0, 0])) for i, b in enumerate(batches[:-1])
            if b["next", "terminated"][0, :, 0].any()]
    assert len(ends) >= 2, "random Breakout play loses a life within 100 steps"
    i, t = ends[0]  # the first life lost: 4 are left, the game goes on
    after = batches[i + 1]
    assert bool(after["is_init"][0, 0]), "the agent starts a new episode after a life loss"
    assert bool((after["prev_action"][0, 0] == 0).all()) and bool((after[RECURRENT_KEYS[0]][0, 0] == 0).all())
    # the env was not reset: the next observation is the final one of the lost life
    torch.testing.assert_close(after["observation"][0, 0], batches[i]["next", "observation"][0, t])
