"""The acting contract: each tdrl policy's ``act`` writes exactly what its TensorDict forward writes, with the same
values under the same RNG state, in training (RANDOM) and evaluation (DETERMINISTIC) modes."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule, TensorDictSequential, set_interaction_type
from torchrl.data import Bounded, Categorical

from tdrl.collect.module_act import module_act
from tdrl.envs import EnvFactory
from tdrl.envs.make import EnvSpecs
from tdrl.models import Acting, EpsilonGreedy, make_actor_critic, make_gaussian_noise
from tdrl.models.q import make_deterministic_actor, make_q_actor, make_tanh_gaussian_actor


def _policies():
    cartpole, pendulum = EnvFactory("CartPole-v1").specs(), EnvFactory("Pendulum-v1").specs()
    eps = EpsilonGreedy(2, eps_init=0.5, eps_final=0.5, eps_final_min=0.1, n_envs=6)
    return {
        "categorical": (4, make_actor_critic(cartpole).actor),
        "categorical_greedy": (4, make_actor_critic(cartpole).greedy),
        "normal": (3, make_actor_critic(pendulum, distribution="normal", normalize_observation=True).actor),
        "tanh_normal": (3, make_actor_critic(pendulum, distribution="tanh_normal").actor),
        "sac": (3, make_tanh_gaussian_actor(pendulum, hidden_sizes=[16])),
        "td3": (3, TensorDictSequential(make_deterministic_actor(pendulum, hidden_sizes=[16]),
                                    make_gaussian_noise(pendulum, std=0.5))),
        "dqn": (4, TensorDictSequential(make_q_actor(cartpole, hidden_sizes=[16], dueling=True), eps)),
        "conv_categorical": ((4, 36, 36), make_actor_critic(EnvSpecs(Bounded(0, 255, (4, 36, 36), dtype=torch.uint8),
                                                                    Categorical(4))).actor),
    }


@pytest.mark.parametrize("name", list(_policies()))
@pytest.mark.parametrize("mode", [InteractionType.RANDOM, InteractionType.DETERMINISTIC])
def test_act_equals_tensordict_forward(name, mode):
    torch.manual_seed(0)
    obs_size, policy = _policies()[name]
    obs = torch.randn(6, obs_size) * 3 if isinstance(obs_size, int) else \
        torch.randint(0, 256, (6, *obs_size), dtype=torch.uint8)  # frames
    torch.manual_seed(1)
    with set_interaction_type(mode), torch.no_grad():
        td = policy(TensorDict({"observation": obs.clone()}, [6]))
    after_forward = torch.rand(2)
    torch.manual_seed(1)
    with set_interaction_type(mode), torch.no_grad():  # act, or each module's act in a sequence
        out = module_act(policy, 6)({"observation": obs}, mode is InteractionType.DETERMINISTIC)
    assert torch.equal(torch.rand(2), after_forward)  # the same random numbers consumed
    assert set(out) == set(td.keys(True, True)) - {"observation"}
    for key, value in out.items():
        assert torch.equal(value, td.get(key)), key


def test_a_plain_tensordict_module_is_not_acting_but_runs_on_tensors():
    module = TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["action"])
    assert not isinstance(module, Acting)
    obs = torch.randn(3, 4)
    assert torch.equal(module_act(TensorDictSequential(module), 3)({"observation": obs}, False)["action"],
                       module(TensorDict({"observation": obs}, [3]))["action"])


def test_gaussian_noise_is_public_and_off_when_deterministic():
    noise = make_gaussian_noise(EnvFactory("Pendulum-v1").specs(), std=0.1)
    action = torch.full((1000, 1), 1.9)
    noisy = noise.act(None, {"action": action}, deterministic=False)["action"]
    assert noisy.max() <= 2.0 and noisy.min() < 1.9  # clamped into the [-2, 2] box
    assert torch.equal(noise.act(None, {"action": action}, deterministic=True)["action"], action)
