"""Q-networks, dueling/categorical heads, the Atari torso and the continuous actors/critics: keys, shapes, maths."""

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical
from torchrl.envs.utils import ExplorationType, set_exploration_type

from tdrl.envs.make import EnvFactory, EnvSpecs
from tdrl.models.conv import AtariConv
from tdrl.models.q import (
    DuelingHead,
    make_deterministic_actor,
    make_q_actor,
    make_q_critic,
    make_tanh_gaussian_actor,
)


@pytest.fixture(scope="module")
def cartpole():
    return EnvFactory("CartPole-v1").specs()


@pytest.fixture(scope="module")
def pendulum():
    return EnvFactory("Pendulum-v1").specs()


def _obs(n, dim=4):
    return TensorDict(observation=torch.randn(n, dim), batch_size=[n])


@pytest.mark.parametrize("dueling", [False, True])
def test_q_actor_keys_shapes(cartpole, dueling):
    actor = make_q_actor(cartpole, hidden_sizes=(16, 16), dueling=dueling)
    td = actor(_obs(5))
    assert td["action_value"].shape == (5, 2) and td["action_value"].dtype == torch.float32
    assert td["action"].shape == (5,) and td["action"].dtype == torch.int64
    assert torch.equal(td["action"], td["action_value"].argmax(-1))
    assert torch.allclose(td["chosen_action_value"].squeeze(-1), td["action_value"].max(-1).values)


@pytest.mark.parametrize("dueling", [False, True])
def test_categorical_actor_log_probs_over_atoms(cartpole, dueling):
    actor = make_q_actor(cartpole, hidden_sizes=(16,), dueling=dueling, n_atoms=11, v_min=-5, v_max=5)
    td = actor(_obs(3))
    logp = td["action_value"]
    assert logp.shape == (3, 11, 2)
    assert torch.allclose(logp.exp().sum(-2), torch.ones(3, 2), atol=1e-5)
    expected_q = (logp.exp() * torch.linspace(-5, 5, 11)[:, None]).sum(-2)
    assert torch.equal(td["action"], expected_q.argmax(-1))


def test_dueling_head_identity_and_shared_bias():
    head = DuelingHead(8, n_actions=3, hidden_sizes=(16,))
    x = torch.randn(4, 8)
    q = head(x)
    value = head.value(x)  # [4, 1]
    # mean over actions of Q is V: the advantages are centred
    assert torch.allclose(q.mean(-1, keepdim=True), value, atol=1e-5)
    assert head.advantage_out.bias is None and head.advantage_bias.shape == (1, 1)


def test_dueling_head_scales_torso_gradient():
    torch.manual_seed(0)
    head = DuelingHead(8, n_actions=3)
    x = torch.randn(4, 8, requires_grad=True)
    head(x).sum().backward()
    scaled = x.grad.clone()
    x.grad = None
    head.grad_scale = 1.0
    head(x).sum().backward()
    assert torch.allclose(scaled, x.grad * 2**-0.5)


def test_distributional_dueling_centres_each_atom():
    head = DuelingHead(8, n_actions=4, n_atoms=5)
    x = torch.randn(2, 8)
    out = head(x)
    assert out.shape == (2, 5, 4)
    assert torch.allclose(out.mean(-1), head.value(x), atol=1e-5)


def test_atari_conv_scales_uint8_inside():
    torso = AtariConv((4, 84, 84))
    frames = torch.randint(0, 256, (2, 3, 4, 84, 84), dtype=torch.uint8)
    out = torso(frames)
    assert out.shape == (2, 3, 3136) and out.dtype == torch.float32
    assert torch.allclose(out, torso(frames.float() / 255.0), atol=1e-6)
    with pytest.raises(ValueError, match="expects"):
        torso(torch.zeros(2, 4, 80, 80, dtype=torch.uint8))


def test_q_actor_on_images_uses_conv_torso():
    specs = EnvSpecs(
        observation_spec=Bounded(0, 255, shape=(4, 84, 84), dtype=torch.uint8),
        action_spec=Categorical(6, shape=(), dtype=torch.int64),
    )
    actor = make_q_actor(specs, dueling=True)
    td = actor(TensorDict(observation=torch.zeros(2, 4, 84, 84, dtype=torch.uint8), batch_size=[2]))
    assert td["action_value"].shape == (2, 6)
    assert any(isinstance(m, AtariConv) for m in actor.modules())


def test_q_actor_rejects_continuous_actions(pendulum):
    with pytest.raises(ValueError, match="discrete.*SAC, TD3 or DDPG"):
        make_q_actor(pendulum)


def test_q_actor_rejects_bad_atoms(cartpole):
    with pytest.raises(ValueError, match="v_max > v_min"):
        make_q_actor(cartpole, n_atoms=51, v_min=1.0, v_max=1.0)


def test_continuous_builders_reject_discrete(cartpole):
    for build in (make_q_critic, make_deterministic_actor, make_tanh_gaussian_actor):
        with pytest.raises(ValueError, match="continuous.*DQN"):
            build(cartpole)


def test_critic_and_actors_keys_and_bounds(pendulum):
    obs = TensorDict(observation=torch.randn(64, 3) * 10, batch_size=[64])
    critic = make_q_critic(pendulum, hidden_sizes=(32,))
    q = critic(obs.clone().set("action", torch.zeros(64, 1)))["state_action_value"]
    assert q.shape == (64, 1)

    mu = make_deterministic_actor(pendulum, hidden_sizes=(32,))
    a = mu(obs.clone())["action"]
    assert a.shape == (64, 1) and a.abs().max() <= 2.0

    pi = make_tanh_gaussian_actor(pendulum, hidden_sizes=(32,))
    td = pi(obs.clone())
    assert set(td.keys()) >= {"loc", "scale", "action"}
    assert td["action"].abs().max() <= 2.0 and (td["scale"] > 0).all()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        a1, a2 = pi(obs.clone())["action"], pi(obs.clone())["action"]
    assert torch.equal(a1, a2)


def test_log_std_params_clamp():
    from tdrl.models.q import LogStdGaussianParams

    loc, scale = LogStdGaussianParams()(torch.tensor([[0.5, 10.0], [0.5, -30.0], [0.5, 0.0]]))
    assert torch.equal(loc, torch.full((3, 1), 0.5))
    assert torch.allclose(scale.squeeze(-1), torch.tensor([2.0, -20.0, 0.0]).exp())
