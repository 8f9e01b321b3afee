"""Environment construction: ids, seeding, specs, pickling, clear errors."""

import pickle

import numpy as np
import pytest
import torch

from tdrl.envs import EnvError, EnvFactory, make_env


def test_seeded_envs_repeat():
    a, b = make_env("CartPole-v1", seed=3), make_env("CartPole-v1", seed=3)
    np.testing.assert_array_equal(a.reset(seed=3)[0], b.reset(seed=3)[0])


def test_factory_pickles_and_gives_specs():
    factory = pickle.loads(pickle.dumps(EnvFactory("Pendulum-v1")))
    specs = factory.specs()
    assert specs.observation_spec.shape == (3,) and specs.observation_spec.dtype == torch.float32
    assert not specs.discrete and specs.n_actions == 1 and specs.max_episode_steps == 200
    cartpole = EnvFactory("CartPole-v1").specs()
    assert cartpole.discrete and cartpole.n_actions == 2


def test_mujoco_specs():
    specs = EnvFactory("HalfCheetah-v5").specs()
    assert specs.observation_spec.shape == (17,) and specs.action_spec.shape == (6,)


def test_unknown_id_suggests_nearest():
    with pytest.raises(EnvError, match="did you mean 'CartPole-v1'"):
        make_env("CartPol-v1")


def test_missing_atari_extra_says_what_to_install():
    pytest.importorskip("torch")
    try:
        import ale_py  # noqa: F401

        pytest.skip("ale-py is installed")
    except ImportError:
        pass
    with pytest.raises(EnvError, match=r"pip install 'tdrl\[atari\]'"):
        make_env("ALE/Pong-v5")
