"""Fixtures shared by the loss tests."""

import pytest

from tdrl.envs.make import EnvFactory


@pytest.fixture(scope="module")
def specs():
    """Pendulum-v1's specs, the continuous-control losses' env (test_dqn_loss overrides it with CartPole's)."""
    return EnvFactory("Pendulum-v1").specs()
