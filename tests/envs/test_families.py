"""Env families (tdrl.envs.families): ids to families, one-line errors naming the missing extra, and a family of
one's own read by the collector, the evaluator and the env factory like a built-in one."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import gymnasium as gym
import pytest

from tdrl.collect import make_collector, make_eval_collector
from tdrl.envs import (
    EnvError,
    EnvFactory,
    EnvFamily,
    EnvTraits,
    families,
    family_of,
    make_env,
    register_family,
    traits_of,
)
from tdrl.envs.families import make_registered

ATARI = EnvTraits(frame_stack=4, game_score=True, episodic_lives=True)


@pytest.fixture
def registry(monkeypatch):
    """Families registered in a test stay in it."""
    monkeypatch.setattr(families, "_REGISTERED", [])


@pytest.mark.parametrize(("env_id", "name", "traits"), [
    ("CartPole-v1", "gymnasium", EnvTraits()),
    ("Pendulum-v1", "gymnasium", EnvTraits()),
    ("NoSuchEnv-v0", "gymnasium", EnvTraits()),  # fails when built, naming the nearest ids
    ("ALE/Pong-v5", "Atari", ATARI),
    ("PongNoFrameskip-v4", "Atari", ATARI),
    ("MinAtar/Breakout-v1", "MinAtar", EnvTraits()),
    ("tdrl/CartPoleNoVelocity-v1", "tdrl", EnvTraits()),
    ("HalfCheetah-v5", "MuJoCo", EnvTraits()),
    ("Hopper-v5", "MuJoCo", EnvTraits()),
])
def test_family_of_known_ids(env_id, name, traits):
    # no optional package imported to answer: matchers look at the id (MuJoCo: gymnasium's registered entry point)
    assert family_of(env_id).name == name
    assert EnvFactory(env_id).traits == traits == traits_of(EnvFactory(env_id))


def test_a_factory_without_traits_has_the_defaults():
    assert traits_of(lambda seed=None: gym.make("CartPole-v1")) == EnvTraits()


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # `import ale_py` raises ImportError, installed or not
    with pytest.raises(EnvError) as caught:
        make_env("ALE/Pong-v5")
    assert str(caught.value) == "environment 'ALE/Pong-v5' (Atari) needs the ale_py package: pip install 'tdrl[atari]'"


def test_missing_dependency_of_a_constructor_names_the_extra(registry):
    def make(env_id, max_episode_steps, kwargs):
        raise gym.error.DependencyNotInstalled("box2d is not installed")

    register_family(EnvFamily("Boxes", lambda env_id: env_id.startswith("boxes/"), make, extra="tdrl[boxes]",
                              gymnasium_ids=False))
    with pytest.raises(EnvError, match=r"^environment 'boxes/A-v0' \(Boxes\) needs an extra: box2d is not "
                                       r"installed: pip install 'tdrl\[boxes\]'$"):
        make_env("boxes/A-v0")


def test_unknown_gymnasium_id_names_the_nearest(registry):
    with pytest.raises(EnvError, match="did you mean 'CartPole-v1'"):
        make_env("CartPol-v1")


def _scored_cartpole(env_id, max_episode_steps, kwargs):
    return make_registered("CartPole-v1", max_episode_steps, kwargs)


SCORED = EnvFamily("Scored", lambda env_id: env_id.startswith("scored/"), _scored_cartpole, gymnasium_ids=False,
                   traits=EnvTraits(game_score=True, episodic_lives=True))


def test_registered_family_takes_its_ids_ahead_of_the_built_in_ones(registry):
    register_family(SCORED)
    assert family_of("scored/CartPole") is SCORED and family_of("CartPole-v1").name == "gymnasium"
    ahead = EnvFamily("Mine", lambda env_id: env_id == "CartPole-v1")
    register_family(ahead)
    assert family_of("CartPole-v1") is ahead
    register_family(EnvFamily("Mine", lambda env_id: False))  # same name: replaces it
    assert family_of("CartPole-v1").name == "gymnasium"
    env = make_env("scored/CartPole", seed=0, max_episode_steps=7)
    assert env.observation_space.shape == (4,) and env.max_episode_steps == 7


def test_collector_and_evaluator_read_a_registered_familys_traits(registry):
    register_family(SCORED)
    with make_collector("serial", EnvFactory("scored/CartPole", {"max_episode_steps": 5}), batch_B=2,
                        batch_T=10) as collector:
        collector.collect()
        infos = collector.traj_infos
    assert infos and all(info["GameScore"] == info["Return"] for info in infos)
    evaluator = make_eval_collector("scored/CartPole", None, n_envs=2, max_steps=5, seed=1)
    infos = evaluator.evaluate()
    assert len(infos) == 2 and all(info["GameScore"] == info["Return"] == 5 for info in infos)
    plain = make_eval_collector("CartPole-v1", None, n_envs=1, max_steps=5, seed=1).evaluate()
    assert "GameScore" not in plain[0]


@dataclass
class EnvSection:
    id: str
    episodic_lives: bool = False


@dataclass
class PlainSection:
    id: str


def test_factory_from_config_passes_family_options(registry):
    assert EnvFactory.from_config(PlainSection("CartPole-v1")) == EnvFactory("CartPole-v1")
    assert EnvFactory.from_config(EnvSection("ALE/Pong-v5")) == EnvFactory("ALE/Pong-v5")
    lives = EnvFactory.from_config(EnvSection("ALE/Pong-v5", episodic_lives=True))
    assert lives == EnvFactory("ALE/Pong-v5", {"episodic_lives": True})
    with pytest.raises(EnvError, match=r"'CartPole-v1' \(gymnasium\) has no lives"):
        EnvFactory.from_config(EnvSection("CartPole-v1", episodic_lives=True))
    register_family(SCORED)  # a family of one's own with the trait takes the option
    assert EnvFactory.from_config(EnvSection("scored/x", True)).kwargs == {"episodic_lives": True}
