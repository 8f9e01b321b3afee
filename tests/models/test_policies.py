"""Actor-critic factories: TensorDict keys/shapes/dtypes in and out, distributions per action space, greedy view
sharing parameters, the conv actor-critic of image observations, ObsNorm statistics, and the LSTM policy replaying a
sequence from its stored state."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical
from torchrl.modules import set_recurrent_mode

from tdrl.config import ActorCriticModelConfig
from tdrl.envs import EnvFactory
from tdrl.envs.make import EnvSpecs
from tdrl.models import MLP, AtariConv, ObsNorm, actor_critic_from, make_actor_critic, make_recurrent_actor_critic
from tdrl.models.conv import SmallImageConv
from tdrl.utils.errors import UserError


@pytest.fixture(scope="module")
def cartpole():
    return EnvFactory("CartPole-v1").specs()


@pytest.fixture(scope="module")
def pendulum():
    return EnvFactory("Pendulum-v1").specs()


def _obs(n, size):
    return TensorDict({"observation": torch.randn(n, size)}, [n])


def test_discrete_actor_critic_keys_shapes(cartpole):
    torch.manual_seed(0)
    ac = make_actor_critic(cartpole)
    out = ac.actor(_obs(5, 4))
    assert out["action"].shape == (5,) and out["action"].dtype == torch.int64
    assert ((out["action"] >= 0) & (out["action"] < 2)).all()
    assert out["logits"].shape == (5, 2) and out["action_log_prob"].shape == (5,)
    # the log-prob is the one of the sampled action under softmax(logits)
    expected = torch.log_softmax(out["logits"], -1).gather(-1, out["action"][:, None]).squeeze(-1)
    torch.testing.assert_close(out["action_log_prob"], expected)
    assert ac.critic(_obs(5, 4))["state_value"].shape == (5, 1)
    greedy = ac.greedy(_obs(5, 4).apply(lambda x: x))  # deterministic: argmax of the same logits
    torch.testing.assert_close(greedy["action"], greedy["logits"].argmax(-1))


def test_greedy_shares_parameters(cartpole):
    ac = make_actor_critic(cartpole)
    assert {id(p) for p in ac.greedy.parameters()} <= {id(p) for p in ac.actor.parameters()}
    obs = _obs(64, 4)
    before = ac.greedy(obs.clone())["action"]
    with torch.no_grad():
        for p in ac.actor.parameters():
            p.add_(torch.randn_like(p))
    assert not torch.equal(before, ac.greedy(obs.clone())["action"])


@pytest.mark.parametrize("dist", ["tanh_normal", "normal"])
def test_continuous_actor_bounds_and_log_std(pendulum, dist):
    ac = make_actor_critic(pendulum, distribution=dist, init_log_std=-1.0)
    out = ac.actor(_obs(256, 3))
    assert out["action"].shape == (256, 1) and out["action_log_prob"].shape == (256,)
    torch.testing.assert_close(out["scale"], torch.full_like(out["scale"], torch.e**-1))
    if dist == "tanh_normal":
        assert out["action"].abs().max() <= 2.0  # Pendulum's torque bound
    greedy = ac.greedy(_obs(4, 3))["action"]
    assert greedy.shape == (4, 1)


def test_distribution_must_fit_action_space(cartpole, pendulum):
    with pytest.raises(ValueError, match="'normal' does not fit this env's discrete"):
        make_actor_critic(cartpole, distribution="normal")
    with pytest.raises(ValueError, match="'categorical' does not fit this env's continuous"):
        make_actor_critic(pendulum, distribution="categorical")


def _image_specs(shape=(4, 84, 84), n_actions=6):
    return EnvSpecs(Bounded(0, 255, shape=shape, dtype=torch.uint8), Categorical(n_actions))


def test_image_observations_get_one_conv_torso_shared_by_both_heads():
    torch.manual_seed(0)
    ac = make_actor_critic(_image_specs())  # what actor_critic_from builds for Atari
    assert isinstance(ac.shared[0][0], AtariConv) and not ac.recurrent and ac.obs_norm is None
    actor_ids, critic_ids = ({id(p) for p in m.parameters()} for m in (ac.actor, ac.critic))
    conv_ids = {id(p) for p in ac.shared[0].parameters()}
    assert conv_ids <= actor_ids & critic_ids  # one torso, not two
    # CleanRL's Atari agent: Nature CNN, 512 hidden, 6 logits and a value: 1,687,719 parameters
    assert sum(p.numel() for p in ac.parameters()) == 1_687_719
    assert ac.shared[1][-1].weight.abs().max() < 0.05  # policy head: orthogonal, gain 0.01
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    out = ac.actor(TensorDict({"observation": frames}, [5]))
    assert out["action"].shape == (5,) and out["logits"].shape == (5, 6) and out["action_log_prob"].shape == (5,)
    value = ac.critic(TensorDict({"observation": frames}, [5]))["state_value"]
    assert value.shape == (5, 1)
    # the loss's joint call runs the torso once and gives what the two modules give; uint8 is scaled in the model
    dist, joint_value = ac.distribution_and_value(frames)
    torch.testing.assert_close(dist.logits, torch.log_softmax(out["logits"], -1))
    torch.testing.assert_close(joint_value, value)
    torch.testing.assert_close(ac.value(frames.float() / 255), value)
    # [B, T] batches (GAE's critic call) keep their leading dims
    assert ac.value(frames.reshape(1, 5, 4, 84, 84)).shape == (1, 5, 1)


def test_small_images_get_minatar_torso_and_image_options_are_checked():
    ac = actor_critic_from(_image_specs((4, 10, 10), 3), ActorCriticModelConfig())
    assert isinstance(ac.shared[0][0], SmallImageConv)
    assert ac.actor(TensorDict({"observation": torch.zeros(2, 4, 10, 10, dtype=torch.uint8)}, [2]))["logits"].shape \
        == (2, 3)
    with pytest.raises(UserError, match="model.lstm=true takes vector observations"):
        actor_critic_from(_image_specs(), ActorCriticModelConfig(lstm=True))
    with pytest.raises(UserError, match="normalize_observation"):
        actor_critic_from(_image_specs(), ActorCriticModelConfig(normalize_observation=True))


def test_obs_norm_matches_batch_statistics_and_is_in_state_dict(cartpole):
    norm = ObsNorm(3, clip=5.0)
    data = torch.randn(1000, 3) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([5.0, -2.0, 0.0])
    for chunk in data.split(137):  # several updates equal one pass over all data
        norm.update(chunk)
    torch.testing.assert_close(norm.mean, data.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False), rtol=1e-4, atol=1e-6)
    assert norm.count.item() == 1000
    z = norm(data)
    assert z.abs().max() <= 5.0 and z.mean(0).abs().max() < 1e-3
    ac = make_actor_critic(cartpole, normalize_observation=True)
    assert any(k.endswith("obs_norm.mean") for k in ac.state_dict())
    assert ac.obs_norm is not None


def test_mlp_orthogonal_init_and_torso():
    torso = MLP(4, None, (32, 16))
    assert torso.out_features == 16 and torso(torch.zeros(2, 4)).shape == (2, 16)
    head = MLP(4, 2, (8,), output_gain=0.01)
    assert head[-1].weight.abs().max() < 0.05 and (head[-1].bias == 0).all()
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        MLP(4, 2, activation="gelu")


def test_lstm_policy_step_and_sequence_replay_from_stored_state(cartpole):
    torch.manual_seed(0)
    ac = make_recurrent_actor_critic(cartpole, hidden_sizes=(16,), lstm_size=8)
    B, T = 3, 6
    obs = torch.randn(B, T, 4)
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[1, 3] = True  # env 1 starts a new episode at t=3
    # step by step, as a collector does: feed back ("next", recurrent_state), zero it where is_init
    h = torch.zeros(B, 1, 8)
    c = torch.zeros(B, 1, 8)
    stored_h, logits = [], []
    for t in range(T):
        keep = (~is_init[:, t]).float()[:, :, None]
        h, c = h * keep, c * keep
        td = TensorDict({"observation": obs[:, t], "is_init": is_init[:, t],
                         "recurrent_state": {"h": h, "c": c}}, [B])
        out = ac.actor(td)
        stored_h.append(h)
        logits.append(out["logits"])
        h, c = out["next", "recurrent_state", "h"], out["next", "recurrent_state", "c"]
    step_logits = torch.stack(logits, 1)
    # training replays the [B, T] batch in recurrent mode from the state stored at t=0 (zeros at is_init)
    seq = TensorDict({"observation": obs, "is_init": is_init,
                      "recurrent_state": {"h": torch.stack(stored_h, 1), "c": torch.zeros(B, T, 1, 8)}}, [B, T])
    with set_recurrent_mode(True):
        replay = ac.actor(seq)
    torch.testing.assert_close(replay["logits"], step_logits, rtol=1e-5, atol=1e-5)
    assert ac.recurrent and replay["action_log_prob"].shape == (B, T)
    value = ac.critic(seq.clone())
    assert value["state_value"].shape == (B, T, 1)
