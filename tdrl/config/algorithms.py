"""The config sections of tdrl's algorithm families, re-exported by :mod:`tdrl.config` (import them from there):
the actor-critic model, loss and optimizer of the policy-gradient recipes (A2C, PPO, IMPALA) and the replay, loss,
optimizer, model and exploration of the off-policy ones (DQN, R2D1, SAC, TD3, DDPG). Keys several recipes share;
a recipe subclasses a section to add keys or change defaults. Plain dataclasses: nothing heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tdrl.utils.ranges import (
    AnyFloat,
    Count,
    Fraction,
    LayerSizes,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveFraction,
)

__all__ = ["A2COptimConfig", "ActionNoiseConfig", "ActorCriticModelConfig", "ContinuousLossConfig",
           "ContinuousModelConfig", "DeterministicPolicyOptimConfig", "OffPolicyLossConfig", "OffPolicyOptimConfig",
           "PolicyGradientLossConfig", "PolicyGradientOptimConfig", "PrioritizedReplayConfig", "ReplayConfig",
           "ReplayDevice"]

ReplayDevice = Literal["auto", "cpu", "cuda"]
"""``replay.device``: where an off-policy recipe gathers its samples (see :func:`tdrl.config.replay_copy`)."""


@dataclass
class PolicyGradientLossConfig:
    """The actor-critic objective of the policy-gradient recipes; each adds its own keys (GAE, clip, V-trace)."""

    gamma: PositiveFraction = 0.99
    """Discount."""
    value_loss_coeff: NonNegativeFloat = 1.0
    """Weight of the value loss 0.5*(V - target)^2 (1.0 equals SB3's vf_coef=0.5 on a plain squared error)."""
    entropy_coeff: NonNegativeFloat = 0.0
    """Weight of the entropy bonus."""
    clip_reward: bool = False
    """Clip each step's reward to [-1, 1] before the advantages (the Atari setting; logged returns stay the game's)."""


@dataclass
class ActorCriticModelConfig:
    """The actor-critic networks of the policy-gradient recipes (A2C, PPO, IMPALA)."""

    hidden_sizes: LayerSizes = field(default_factory=lambda: [64, 64])
    """Hidden widths of the actor and critic MLPs (the LSTM policy's embedding uses the first); image observations
    (Atari) get one Nature-DQN conv torso shared by both heads instead."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "tanh"
    """Hidden activation."""
    lstm: bool = False
    """Recurrent policy: MLP embedding -> LSTM (shared by actor and critic) -> heads."""
    lstm_size: Count = 64
    """LSTM hidden size."""
    distribution: Literal["auto", "categorical", "normal", "tanh_normal"] = "auto"
    """Action distribution; auto = categorical for discrete actions, tanh_normal for continuous ones."""
    init_log_std: AnyFloat = 0.0
    """Initial log standard deviation of Gaussian policies."""
    normalize_observation: bool = False
    """Normalise observations by running mean/std inside the model (rlpyt normalize_observation)."""


@dataclass
class PolicyGradientOptimConfig:
    """Optimizer of the policy-gradient recipes."""

    lr: PositiveFloat = 3e-4
    """Learning rate (start value when decayed)."""
    eps: PositiveFloat = 1e-5
    """Optimizer epsilon."""
    max_grad_norm: PositiveFloat = 0.5
    """Gradient norm clip (rlpyt clip_grad_norm)."""
    compile: bool = False
    """torch.compile the loss (opt-in: compiling takes tens of seconds on CPU)."""


@dataclass
class A2COptimConfig(PolicyGradientOptimConfig):
    """Optimizer of A2C and IMPALA: RMSprop or Adam, optionally decayed."""

    name: Literal["adam", "rmsprop"] = "rmsprop"
    """Optimizer: rmsprop (alpha 0.99, as A3C/SB3) or adam (rlpyt's default)."""
    linear_decay: bool = False
    """Decay the learning rate linearly to 0 over the run."""


@dataclass
class ReplayConfig:
    """The replay buffer of an off-policy recipe."""

    size: Count = 100_000
    """Transitions held (rlpyt replay_size)."""
    device: ReplayDevice = "auto"
    """Where samples are gathered: cpu (host memory, each sample copied to run.device), cuda (a copy of the data
    on run.device; sync trainer; Atari's frames too), auto (cuda when run.device is a GPU, the data fits a quarter of
    it and it holds no frame stack)."""


@dataclass
class PrioritizedReplayConfig(ReplayConfig):
    """A replay that may sample by priority (rlpyt's prioritized replay)."""

    prioritized: bool = False
    """Prioritized replay by |TD error|."""
    alpha: NonNegativeFloat = 0.6
    """Priority exponent (rlpyt pri_alpha)."""
    beta_init: Fraction = 0.4
    """Importance-weight exponent at the start (rlpyt pri_beta_init)."""
    beta_final: Fraction = 1.0
    """Importance-weight exponent after beta_steps frames (rlpyt pri_beta_final)."""
    beta_steps: NonNegativeInt = 100_000
    """Env frames over which beta anneals (rlpyt pri_beta_steps)."""


@dataclass
class OffPolicyLossConfig:
    """The bootstrapped target of an off-policy recipe."""

    gamma: PositiveFraction = 0.99
    """Discount per env step."""
    n_step: Count = 1
    """n-step returns (rlpyt n_step_return); the bootstrap is gamma ** steps, per sample."""


@dataclass
class ContinuousLossConfig(OffPolicyLossConfig):
    """The bootstrapped target of the continuous-control recipes (SAC, TD3, DDPG)."""

    bootstrap_timelimit: bool = True
    """Bootstrap through time limits (rlpyt bootstrap_timelimit); false treats them as terminal."""


@dataclass
class OffPolicyOptimConfig:
    """Update cadence and optimizer settings of an off-policy recipe (rlpyt's names)."""

    batch_size: Count = 256
    """Transitions per gradient update."""
    replay_ratio: PositiveFloat = 256.0
    """Transitions sampled per transition collected (rlpyt replay_ratio); sets updates per iteration."""
    min_steps_learn: Count = 1_000
    """Env frames collected before the first update (rlpyt min_steps_learn)."""
    target_update_interval: Count = 1
    """Gradient updates between target updates (rlpyt target_update_interval)."""
    target_update_tau: PositiveFraction = 0.005
    """Polyak factor of the target networks; 1.0 copies (rlpyt target_update_tau)."""
    max_grad_norm: PositiveFloat | None = None
    """Gradient norm clip (rlpyt clip_grad_norm; None: none)."""
    compile: bool = False
    """torch.compile the loss (opt-in: compiling takes tens of seconds on CPU)."""
    cudagraphs: bool = False
    """Replay each update (loss, backward, step) from CUDA graphs (needs run.device=cuda)."""


@dataclass
class DeterministicPolicyOptimConfig(OffPolicyOptimConfig):
    """The optimizer settings of the deterministic-policy recipes (TD3, DDPG): one Adam rate per network."""

    actor_lr: PositiveFloat = 1e-3
    """Adam learning rate of the policy (rlpyt mu_learning_rate; DDPG's learning_rate)."""
    critic_lr: PositiveFloat = 1e-3
    """Adam learning rate of the critics (rlpyt q_learning_rate)."""


@dataclass
class ContinuousModelConfig:
    """The policy and Q critics of the continuous-control recipes (SAC, TD3, DDPG)."""

    hidden_sizes: LayerSizes = field(default_factory=lambda: [256, 256])
    """Hidden widths of the policy and of each Q critic."""


@dataclass
class ActionNoiseConfig:
    """Gaussian exploration noise of a deterministic policy (TD3, DDPG; rlpyt's action_std, no Ornstein-Uhlenbeck)."""

    action_noise: NonNegativeFloat = 0.1
    """Std of the Gaussian exploration noise, relative to the half-width of the action box (rlpyt action_std)."""
    pretrain_std: NonNegativeFloat | None = None
    """The noise's std before optim.min_steps_learn frames, same units (rlpyt pretrain_std); None: action_noise."""
