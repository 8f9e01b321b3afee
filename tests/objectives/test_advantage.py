"""tdrl's one-forward GAE equals TorchRL's GAE module and a hand computation, with time-limit bootstrapping; tdrl's
V-trace equals TorchRL's VTrace module where that scores the right actions, the paper's formula by hand, and GAE
(lambda=1) on-policy, and it scores the actions taken where TorchRL's module does not."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.modules import ValueOperator
from torchrl.objectives.value import GAE as TorchRLGAE
from torchrl.objectives.value import VTrace as TorchRLVTrace

from tdrl.collect import make_collector
from tdrl.envs import EnvFactory
from tdrl.models import make_actor_critic, make_recurrent_actor_critic
from tdrl.models.acting import ProbabilisticPolicy
from tdrl.objectives.advantage import GAE, ReturnNorm, VTrace


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


# --- V-trace --------------------------------------------------------------------------------------------------


class FixedLogits(torch.nn.Module):
    """A policy net that ignores the observation: the same action probabilities everywhere."""

    def __init__(self, probs: list[float]) -> None:
        super().__init__()
        self.register_buffer("logits", torch.tensor(probs).log())

    def forward(self, obs):
        return self.logits.expand(*obs.shape[:-1], -1)


class SumValue(torch.nn.Module):
    def forward(self, obs):
        return obs.sum(-1, keepdim=True)


def _fixed_actor(probs: list[float]) -> ProbabilisticPolicy:
    spec = EnvFactory("CartPole-v1").specs().action_spec
    return ProbabilisticPolicy(FixedLogits(probs), ["logits"], spec, torch.distributions.Categorical)


def _behaviour_batch(B: int, T: int) -> TensorDict:
    """``_batch`` with actions and behaviour log-probabilities on both sides of the current policy's."""
    batch = _batch(B, T)
    batch["action"] = torch.randint(0, 2, (B, T))
    batch["action_log_prob"] = torch.empty(B, T).uniform_(-2.0, -0.1)
    return batch


@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, 0.5)])
def test_vtrace_equals_torchrl_vtrace_where_it_scores_the_right_actions(rho_bar, c_bar):
    """Under a uniform policy every action has the same probability, so TorchRL's module (which scores a fresh
    sample) gets the right importance weights: both must agree, with truncations and terminations in the batch."""
    actor = _fixed_actor([0.5, 0.5])
    critic = make_actor_critic(EnvFactory("CartPole-v1").specs()).critic
    ours = VTrace(actor, critic, gamma=0.97, rho_bar=rho_bar, c_bar=c_bar)(_behaviour_batch(6, 12))
    ref = _behaviour_batch(6, 12)
    with torch.no_grad():
        TorchRLVTrace(gamma=0.97, actor_network=actor, value_network=critic, rho_thresh=rho_bar,
                      c_thresh=c_bar)(ref)
    assert 0 < ours["rho"].min() < ours["rho"].max() <= rho_bar  # the weights vary and some are clipped
    for key in ("state_value", "advantage", "value_target"):
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-5, atol=1e-5)


def test_vtrace_hand_computed():
    """The paper's v_s and advantage on one env, 3 steps, V(x) = x, gamma 0.5, rho_bar = c_bar = 1: pi = (0.8, 0.2),
    actions (0, 1, 0) taken with mu = (0.4, 0.4, 0.8): rho = (2 -> 1, 0.5, 1); t=1 ends by time limit (final obs
    10, bootstrapped, trace cut), t=2 terminates."""
    flags = lambda *v: torch.tensor(v).reshape(1, 3, 1)  # noqa: E731
    batch = TensorDict({
        "observation": flags(1.0, 2.0, 3.0), "action": torch.tensor([[0, 1, 0]]),
        "action_log_prob": torch.tensor([[0.4, 0.4, 0.8]]).log(),
        "next": {"observation": flags(2.0, 10.0, 4.0), "reward": flags(1.0, 1.0, 1.0),
                 "done": flags(False, True, True), "terminated": flags(False, False, True)}}, [1, 3])
    VTrace(_fixed_actor([0.8, 0.2]), ValueOperator(SumValue(), in_keys=["observation"]), gamma=0.5)(batch)
    # TD errors rho_t (r + g V(x_t+1) - V(x_t)): 1*(1 + 1 - 1) = 1, 0.5*(1 + 5 - 2) = 2, 1*(1 + 0 - 3) = -2
    # v_2 = 3 - 2 = 1; v_1 = 2 + 2 = 4 (trace cut); v_0 = 1 + 1 + 0.5*1*(4 - 2) = 3
    torch.testing.assert_close(batch["value_target"].flatten(), torch.tensor([3.0, 4.0, 1.0]))
    # rho_s (r_s + g v_s+1 - V(x_s)), v_s+1 = V(final obs) at an episode's end: 1*(1 + 2 - 1), 0.5*(1 + 5 - 2), -2
    torch.testing.assert_close(batch["advantage"].flatten(), torch.tensor([2.0, 2.0, -2.0]))
    torch.testing.assert_close(batch["rho"].flatten(), torch.tensor([1.0, 0.5, 1.0]))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("recurrent", [False, True])
def test_vtrace_on_policy_is_the_bootstrapped_return(env_id, recurrent):
    """Unrolls collected by the learner's own policy: pi(a)/mu(a) = 1 for the stored actions, so V-trace's target
    and advantage are GAE's with lambda = 1 (TorchRL's GAE kernel)."""
    torch.manual_seed(0)
    env_factory = EnvFactory(env_id)
    make = make_recurrent_actor_critic if recurrent else make_actor_critic
    ac = make(env_factory.specs(), hidden_sizes=(16,))
    collector = make_collector("serial", env_factory, ac.actor, batch_B=2, batch_T=40, seed=0)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    ours = VTrace(ac.actor, ac.critic, gamma=0.99)(batch.clone())
    ref = GAE(ac.critic, gamma=0.99, lmbda=1.0)(batch.clone())
    torch.testing.assert_close(ours["rho"], torch.ones_like(ours["rho"]), rtol=0, atol=2e-6)
    for key in ("state_value", "advantage", "value_target"):
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-3)


def test_torchrl_vtrace_scores_a_fresh_sample_not_the_action_taken():
    """Why tdrl wraps TorchRL's kernel rather than its module (torchrl 0.14.1): on-policy unrolls of the unlikely
    action 1 have rho = 1, but TorchRL's module scores a fresh sample (action 0, probability ~1) against mu(1).
    If this fails, TorchRL fixed its VTrace: use the module in VTrace's place."""
    actor = _fixed_actor([1 - 1e-6, 1e-6])
    critic = ValueOperator(SumValue(), in_keys=["observation"])
    batch = _batch(2, 5)
    batch["action"] = torch.ones(2, 5, dtype=torch.int64)
    batch["action_log_prob"] = torch.full((2, 5), 1e-6).log()
    ours = VTrace(actor, critic, gamma=0.9, rho_bar=1e9, c_bar=1e9)(batch.clone())
    ref = batch.clone()
    with torch.no_grad():
        TorchRLVTrace(gamma=0.9, actor_network=actor, value_network=critic, rho_thresh=1e9, c_thresh=1e9)(ref)
    torch.testing.assert_close(ours["rho"], torch.ones_like(ours["rho"]))
    assert not torch.allclose(ours["advantage"], ref["advantage"])


def test_vtrace_needs_the_behaviour_log_prob():
    ac = make_actor_critic(EnvFactory("CartPole-v1").specs())
    batch = _behaviour_batch(2, 3).exclude("action_log_prob")
    with pytest.raises(KeyError, match="behaviour policy's log-probabilities 'action_log_prob'"):
        VTrace(ac.actor, ac.critic, gamma=0.9)(batch)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        VTrace(ac.actor, ac.critic, gamma=0.9)(_behaviour_batch(2, 3).reshape(-1))


def _returns_by_hand(reward, done, gamma):
    """Each env's discounted return at every step, restarting after a done (SB3's VecNormalize ``returns``)."""
    B, T = reward.shape
    running, out = [0.0] * B, torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            running[b] = gamma * running[b] + float(reward[b, t])
            out[b, t] = running[b]
            if done[b, t]:
                running[b] = 0.0
    return out


def test_return_norm_divides_by_the_std_of_every_return_so_far_and_carries_returns_across_batches():
    norm, gamma = ReturnNorm(6, gamma=0.9), 0.9
    batches = [_batch(6, 16) for _ in range(3)]
    for i, batch in enumerate(batches):
        batch["next", "reward"] = batch["next", "reward"] * 50 + i  # a scale and offset far from 1
    whole_reward = torch.cat([b["next", "reward"] for b in batches], 1).squeeze(-1)
    whole_done = torch.cat([b["next", "done"] for b in batches], 1).squeeze(-1)
    returns = _returns_by_hand(whole_reward, whole_done, gamma)
    for batch in batches:
        raw = batch["next", "reward"].clone()
        norm(batch)
    expected = (raw.double() / returns.var(unbiased=False).add(1e-8).sqrt()).clamp(-10, 10)
    torch.testing.assert_close(batches[-1]["next", "reward"].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.running_return, torch.where(whole_done[:, -1], 0.0, returns[:, -1]))


def test_return_norm_ignores_the_reward_scale_and_resumes_from_its_state_dict():
    first, scaled = ReturnNorm(6, gamma=0.99), ReturnNorm(6, gamma=0.99)
    batch, big = _batch(6, 8), _batch(6, 8)
    big["next", "reward"] = big["next", "reward"] * 1000
    torch.testing.assert_close(first(batch)["next", "reward"], scaled(big)["next", "reward"], rtol=1e-4, atol=1e-5)
    resumed = ReturnNorm(6, gamma=0.99)
    resumed.load_state_dict(first.state_dict())
    torch.testing.assert_close(resumed(_batch(6, 8))["next", "reward"], first(_batch(6, 8))["next", "reward"])
    with pytest.raises(ValueError, match="ReturnNorm for 6 envs expects a \\[B, T\\] batch with that B"):
        first(_batch(4, 8))
