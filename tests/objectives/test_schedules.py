"""Linear schedules: rlpyt's PPO LR/clip decay over iterations, epsilon between itr_min and itr_max, PER beta."""

import pytest

from tdrl.objectives.schedules import LinearSchedule


def test_linear_decay_to_zero_over_iterations():
    lr = LinearSchedule(1e-3, 0.0, duration=100)
    assert lr(0) == 1e-3
    assert lr(25) == pytest.approx(7.5e-4)
    assert lr(99) == pytest.approx(1e-5)
    assert lr(100) == 0.0 and lr(1000) == 0.0


def test_delay_holds_start_then_ramps_like_rlpyt_epsilon():
    # eps_init=1 until eps_itr_min=50, linear to eps_final=0.01 at eps_itr_max=1000
    eps = LinearSchedule(1.0, 0.01, duration=950, delay=50)
    assert eps(0) == 1.0 and eps(50) == 1.0
    assert eps(525) == pytest.approx(1.0 + 0.5 * (0.01 - 1.0))
    assert eps(1000) == 0.01 and eps(10**6) == 0.01


def test_increasing_schedule_for_beta_and_zero_duration():
    beta = LinearSchedule(0.4, 1.0, duration=1000)
    assert beta(500) == pytest.approx(0.7)
    step = LinearSchedule(1.0, 0.1, duration=0, delay=10)
    assert step(9) == 1.0 and step(10) == 0.1 and step(11) == 0.1


def test_bad_arguments():
    with pytest.raises(ValueError, match="duration"):
        LinearSchedule(1.0, 0.0, duration=-1)
