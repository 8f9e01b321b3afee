"""Environment construction: ids, seeding, specs, pickling, clear errors."""

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from tdrl.envs import EnvError, EnvFactory, TimeLimit, make_env


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


def test_time_limit_is_tdrls_with_the_registered_or_the_given_limit():
    # tdrl's TimeLimit: its step counter is public, so env state can be checkpointed (tdrl.envs.state)
    env = make_env("CartPole-v1")
    assert isinstance(env, TimeLimit) and env.max_episode_steps == 500 and env.spec.max_episode_steps == 500
    assert make_env("CartPole-v1", max_episode_steps=7).max_episode_steps == 7
    assert not isinstance(make_env("CartPole-v1", max_episode_steps=-1), TimeLimit)
    assert EnvFactory("CartPole-v1", {"max_episode_steps": 7}).specs().max_episode_steps == 7


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


def test_mujoco_warnings_become_python_warnings_and_leave_no_log_file(tmp_path):
    # A fresh process in an empty directory: MuJoCo's default handler would print every compiler warning and append
    # it to MUJOCO_LOG.TXT there (mujoco 4.0 warns once per HalfCheetah env built).
    script = (
        "import warnings, mujoco\n"
        "from tdrl.envs import make_env\n"
        "envs = [make_env('HalfCheetah-v5') for _ in range(3)]\n"
        "handler = mujoco.get_mju_user_warning()\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    handler('probe message')\n"
        "assert [str(w.message) for w in caught] == ['MuJoCo - probe message'], caught\n"
        "assert caught[0].category is RuntimeWarning\n"
        "warnings.simplefilter('error')\n"
        "handler('as error')  # must not raise: an exception in MuJoCo's C callback aborts the process\n"
        "print('survived')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "survived" in out.stdout
    assert "MuJoCo warning: as error" in out.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    # one line per distinct message and process, not one per env
    assert out.stderr.count("compiler attribute") <= 1


def test_a_users_mujoco_warning_handler_is_kept():
    mujoco = pytest.importorskip("mujoco")
    before = mujoco.get_mju_user_warning()
    messages = []
    mujoco.set_mju_user_warning(messages.append)
    try:
        make_env("HalfCheetah-v5").close()
        assert mujoco.get_mju_user_warning() == messages.append
    finally:
        mujoco.set_mju_user_warning(before)
