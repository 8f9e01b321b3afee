"""A single-agent env with a dict observation and an action mask trains through tdrl's collector: TorchRL's PPO
loss and GAE on the ``[B, T]`` batches, a policy reading ``observation``, the nested ``("goal", "xy")`` and
sampling from a ``MaskedCategorical`` over ``action_mask`` (the env asserts that no masked action reaches it)."""

from __future__ import annotations

import pytest
import torch
from grouped_helpers import MaskedWalkFactory
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import MaskedCategorical, ProbabilisticActor
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from tdrl.collect import make_collector
from tdrl.utils.seeding import seed_everything


class GoalNet(nn.Module):
    """An MLP over the walk's position and its goal: ``out`` logits or one value."""

    def __init__(self, out: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, out))

    def forward(self, obs: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, goal], -1))


def mean_return(batch) -> float:
    """The batch's reward per episode end (its episodes' mean return, near enough over 8 x 32 steps)."""
    return float(batch["next", "reward"].sum() / batch["next", "done"].sum().clamp_min(1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_masked_dict_observation_env_trains_with_ppo(kind):
    seed_everything(0)
    logits = TensorDictModule(GoalNet(3), in_keys=["observation", ("goal", "xy")], out_keys=["logits"])
    actor = ProbabilisticActor(logits, in_keys={"logits": "logits", "mask": "action_mask"}, out_keys=["action"],
                               distribution_class=MaskedCategorical, return_log_prob=True)
    critic = TensorDictModule(GoalNet(1), in_keys=["observation", ("goal", "xy")], out_keys=["state_value"])
    loss = ClipPPOLoss(actor, critic, entropy_coeff=0.01)
    loss.make_value_estimator(GAE, gamma=0.99, lmbda=0.95, value_network=critic)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-3)
    returns = []
    extra = {"n_workers": 2} if kind == "parallel" else {}
    with make_collector(kind, MaskedWalkFactory(), actor, batch_B=8, batch_T=32, seed=1, **extra) as collector:
        for _ in range(25):
            batch = collector.collect()
            returns.append(mean_return(batch))
            with torch.no_grad():
                loss.value_estimator(batch)
            data = batch.reshape(-1)
            for _ in range(4):
                terms = loss(data)
                optim.zero_grad()
                (terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]).backward()
                optim.step()
    first, last = sum(returns[:3]) / 3, sum(returns[-3:]) / 3
    # reward -|goal - position| each step, goals 2-4: random play averages about -12 an episode, walking straight to
    # the goal -1 to -6 (-3.3 over the goals)
    assert last > first + 3 and last > -6, (first, last)
