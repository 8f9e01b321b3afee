"""Models: plain torsos (``nets``, ``conv``), actor-critic factories (``policies``), Q-models (``q``), exploration,
and the acting contract collectors call (``acting``)."""

from tdrl.models.acting import Acting, ObservationModule, ProbabilisticPolicy, chain_policy
from tdrl.models.conv import AtariConv
from tdrl.models.exploration import ApexEpsilons, EpsilonGreedy, GaussianNoise, make_gaussian_noise
from tdrl.models.nets import MLP, ObsNorm
from tdrl.models.policies import (
    ActorCritic,
    actor_critic_from,
    make_actor_critic,
    make_conv_actor_critic,
    make_recurrent_actor_critic,
)
from tdrl.models.q import (
    DuelingHead,
    QActor,
    QNetwork,
    TwinQ,
    make_deterministic_actor,
    make_q_actor,
    make_q_critic,
    make_tanh_gaussian_actor,
    make_twin_q,
)

__all__ = [
    "MLP", "Acting", "ActorCritic", "ApexEpsilons", "actor_critic_from", "AtariConv", "DuelingHead", "EpsilonGreedy",
    "GaussianNoise",
    "ObsNorm", "ObservationModule", "ProbabilisticPolicy", "QActor", "QNetwork", "TwinQ", "make_actor_critic",
    "make_conv_actor_critic",
    "make_deterministic_actor", "make_gaussian_noise", "make_q_actor", "make_q_critic", "make_recurrent_actor_critic",
    "chain_policy", "make_tanh_gaussian_actor", "make_twin_q",
]
