"""tdrl's one-forward GAE equals TorchRL's GAE module and a hand computation, with time-limit bootstrapping."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives.value import GAE as TorchRLGAE

from tdrl.envs import EnvFactory
from tdrl.models import make_actor_critic, make_recurrent_actor_critic
from tdrl.objectives.advantage import GAE


def _batch(B: int, T: int, obs_size: int = 4) -> TensorDict:
    torch.manual_seed(0)
    done = torch.rand(B, T, 1) < 0.15
    terminated = done & (torch.rand(B, T, 1) < 0.5)  # the rest of the dones are time-limit truncations
    return TensorDict({
        "observation": torch.randn(B, T, obs_size),
        "is_init": torch.zeros(B, T, 1, dtype=torch.bool),
        "next": {"observation": torch.randn(B, T, obs_size), "reward": torch.randn(B, T, 1), "done": done,
                 "terminated": terminated, "truncated": done & ~terminated},
    }, [B, T])


@pytest.mark.parametrize("T", [5, 64])
@pytest.mark.parametrize("lmbda", [0.8, 1.0])
def test_equals_torchrl_gae(T, lmbda):
    ac = make_actor_critic(EnvFactory("CartPole-v1").specs())
    ours = GAE(ac.critic, gamma=0.97, lmbda=lmbda)(_batch(6, T))
    ref = _batch(6, T)
    with torch.no_grad():
        TorchRLGAE(gamma=0.97, lmbda=lmbda, value_network=ac.critic, deactivate_vmap=True)(ref)
    for key in ("state_value", "advantage", "value_target"):
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-5, atol=1e-5)


def test_hand_computed_time_limit_bootstrap():
    """One env, 3 steps, V(s) = sum(obs): truncation at t=1 bootstraps from the final obs, termination at t=2 not."""

    class SumValue(torch.nn.Module):
        def forward(self, obs):
            return obs.sum(-1, keepdim=True)

    from torchrl.modules import ValueOperator

    critic = ValueOperator(SumValue(), in_keys=["observation"])
    obs = torch.tensor([[[1.0], [2.0], [3.0]]])
    next_obs = torch.tensor([[[2.0], [10.0], [4.0]]])  # t=1 ends by time limit with final obs 10; t=2 terminates
    flags = lambda *v: torch.tensor(v).reshape(1, 3, 1)  # noqa: E731
    batch = TensorDict({"observation": obs, "next": {
        "observation": next_obs, "reward": flags(1.0, 1.0, 1.0), "done": flags(False, True, True),
        "terminated": flags(False, False, True)}}, [1, 3])
    g, lam = 0.5, 1.0
    GAE(critic, gamma=g, lmbda=lam)(batch)
    # t=2: terminal -> target 1; t=1: truncated -> 1 + g*V(10) = 6, trace cut; t=0: 1 + g*(target at t=1) = 4
    torch.testing.assert_close(batch["value_target"].flatten(), torch.tensor([4.0, 6.0, 1.0]))
    torch.testing.assert_close(batch["advantage"].flatten(), torch.tensor([4.0 - 1, 6.0 - 2, 1.0 - 3]))


def test_recurrent_critic_uses_stored_states():
    ac = make_recurrent_actor_critic(EnvFactory("CartPole-v1").specs(), hidden_sizes=(8,), lstm_size=4)
    B, T = 3, 5
    batch = _batch(B, T)
    batch["recurrent_state"] = {"h": torch.randn(B, T, 1, 4), "c": torch.randn(B, T, 1, 4)}
    batch["next", "recurrent_state"] = {"h": torch.randn(B, T, 1, 4), "c": torch.randn(B, T, 1, 4)}
    GAE(ac.critic, gamma=0.9, lmbda=0.9)(batch)
    # the value of step t is the critic run one step from the state stored at t
    t = 2
    step = TensorDict({"observation": batch["observation"][:, t], "is_init": batch["is_init"][:, t],
                       "recurrent_state": batch["recurrent_state"][:, t]}, [B])
    with torch.no_grad():
        expected = ac.critic(step)["state_value"]
    torch.testing.assert_close(batch["state_value"][:, t], expected, rtol=1e-5, atol=1e-6)
    assert batch["advantage"].shape == (B, T, 1)


def test_rejects_flat_batch():
    ac = make_actor_critic(EnvFactory("CartPole-v1").specs())
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        GAE(ac.critic, gamma=0.9, lmbda=0.9)(_batch(2, 3).reshape(-1))
