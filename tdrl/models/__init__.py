"""tdrl.models."""
from tdrl.models.conv import AtariConv  # noqa: E402
from tdrl.models.exploration import EpsilonGreedy, make_gaussian_noise  # noqa: E402
from tdrl.models.q import (  # noqa: E402
    DuelingHead,
    QNetwork,
    make_deterministic_actor,
    make_q_actor,
    make_q_critic,
    make_tanh_gaussian_actor,
)
