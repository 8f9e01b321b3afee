"""R2D1: recurrent replay distributed DQN (Kapturowski et al. 2019) as rlpyt runs it on one machine.

An LSTM Q-network (conv torso for images, MLP for vectors; dueling head) reads the observation, the previous action
and the previous reward. Wait-reset collectors store the recurrent state at the start of every batch
(``store_rnn_state_interval = collector.batch_T``), so every replayed sequence starts from a stored state: the
online network burns in ``replay.warmup_T`` steps, trains on ``replay.batch_T``, and the target network starts from
the same state. Targets are n-step double-Q with value rescaling; sequences are prioritized by
``eta * max + (1 - eta) * mean |TD|``, new ones by the TD errors of the Q-values recorded while acting (input
priorities). ``optim.replay_ratio`` counts every replayed step (burn-in and lookahead too) per collected frame.
rlpyt's Atari defaults are named in each field's doc; the defaults here are for the quick recurrent check,
CartPole without velocities (a POMDP): greedy evaluation reaches 475 on seeds 0-2 (60k-150k frames). With
``env.episodic_lives=true`` training episodes end at each lost life while their TrajInfos span the game, and
evaluation plays whole games, so ``train/`` and ``eval/return_mean`` are game scores.

    python recipes/r2d1.py                                     # tdrl/CartPoleNoVelocity-v1
    python recipes/r2d1.py trainer.kind=async                  # collector process + optimizer process
    python recipes/r2d1.py env.id=MinAtar/Breakout-v1 model.lstm_size=128 model.head_sizes=[128] \
        replay.warmup_T=10 optim.batch_B=16 optim.lr=3e-4 optim.lr_final=none optim.adam_eps=1e-5 \
        optim.replay_ratio=32 optim.target_update_interval=500 exploration.eps_final=0.1 exploration.eps_steps=100000
    python recipes/r2d1.py --help                              # every key

Atari (rlpyt's R2D1 defaults; ``pip install 'tdrl[atari]'``; episodic lives as rlpyt trains it)::

    python recipes/r2d1.py env.id=ALE/Pong-v5 env.episodic_lives=true collector.kind=parallel collector.batch_B=16 \
        collector.batch_T=40 replay.warmup_T=40 replay.batch_T=80 replay.size=1000000 model.lstm_size=512 \
        model.head_sizes=[512] loss.gamma=0.997 optim.lr=1e-4 optim.batch_B=64 optim.replay_ratio=1 \
        optim.min_steps_learn=100000 optim.target_update_interval=2500 exploration.eps_steps=1000000
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from tdrl.config import (
    AtariEnvConfig,
    CollectorConfig,
    ConfigError,
    Count,
    EpsilonGreedyConfig,
    Fraction,
    LayerSizes,
    LoggerConfig,
    NonNegativeFloat,
    NonNegativeInt,
    OffPolicyTrainerConfig,
    PositiveFloat,
    PositiveFraction,
    RecipeConfig,
    RunConfig,
    run_recipe,
)

REPLAY_KEYS = ["observation", "prev_action", "prev_reward", "is_init", "action", ("next", "reward"),
               ("next", "terminated"), ("next", "truncated"), ("next", "done"), ("collector", "mask")]
STATE_KEYS = [("recurrent_state", "h"), ("recurrent_state", "c")]


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class R2D1EnvConfig(AtariEnvConfig):
    id: str = "tdrl/CartPoleNoVelocity-v1"
    """Gymnasium id: vector, MinAtar (``MinAtar/Breakout-v1``) or Atari (``ALE/Pong-v5``) observations."""


@dataclass
class ModelConfig:
    hidden_sizes: LayerSizes = field(default_factory=lambda: [64])
    """MLP torso of vector observations (images: the conv torso and its 512 or, MinAtar, 128-wide layer)."""
    lstm_size: Count = 64
    """LSTM width (rlpyt: 512)."""
    head_sizes: list[Count] = field(default_factory=lambda: [64])
    """Hidden widths of the Q head (rlpyt: [512])."""
    dueling: bool = True
    """Dueling head (rlpyt's AtariR2d1Model: True)."""


@dataclass
class ReplayConfig:
    size: Count = 100_000
    """Time steps held (rlpyt replay_size: 1e6)."""
    warmup_T: NonNegativeInt = 20
    """Burn-in steps before the trained ones (rlpyt: 40)."""
    batch_T: Count = 20
    """Trained steps per sequence (rlpyt: 80)."""
    prioritized: bool = True
    """Prioritized sequences (rlpyt: True)."""
    alpha: NonNegativeFloat = 0.6
    """Priority exponent (rlpyt pri_alpha)."""
    beta: Fraction = 0.9
    """Importance-weight exponent, constant (rlpyt pri_beta_init = pri_beta_final = 0.9)."""
    eta: Fraction = 0.9
    """Sequence priority eta * max + (1 - eta) * mean |TD| (rlpyt pri_eta)."""
    input_priorities: bool = True
    """New sequences get priorities from the Q-values recorded while acting (rlpyt: True)."""


@dataclass
class LossConfig:
    gamma: PositiveFraction = 0.99
    """Discount per env step (rlpyt: 0.997)."""
    n_step: Count = 5
    """n-step returns (rlpyt n_step_return)."""
    double: bool = True
    """Double DQN targets (rlpyt double_dqn)."""
    value_scale_eps: PositiveFloat = 1e-3
    """eps of the value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + eps x (rlpyt value_scale_eps)."""
    clip_reward: bool = False
    """Clip rewards to [-1, 1] in the targets (R2D1 rescales values instead; rlpyt's Atari env clips)."""


@dataclass
class OptimConfig:
    lr: PositiveFloat = 1e-3
    """Adam learning rate (rlpyt: 1e-4)."""
    lr_final: NonNegativeFloat | None = 1e-4
    """Decay the learning rate linearly to this over the run; None keeps it constant (rlpyt)."""
    adam_eps: PositiveFloat = 1e-3
    """Adam epsilon (R2D2: 1e-3)."""
    batch_B: Count = 32
    """Sequences per gradient update (rlpyt batch_B: 64)."""
    replay_ratio: PositiveFloat = 64.0
    """Replayed steps (all L = warmup + batch + n_step of each sequence) per collected frame (rlpyt: 1, counting
    trained steps)."""
    min_steps_learn: Count = 5_000
    """Env frames before the first update (rlpyt: 1e5)."""
    target_update_interval: Count = 50
    """Gradient updates between target copies (rlpyt: 2500)."""
    max_grad_norm: PositiveFloat = 80.0
    """Gradient norm clip (rlpyt clip_grad_norm)."""
    compile: bool = False
    """torch.compile the loss (opt-in: compiling takes tens of seconds on CPU)."""


@dataclass
class R2D1CollectorConfig(CollectorConfig):
    batch_B: Count = 8
    """Environments stepped together (rlpyt R2D1 Atari: 16 per worker group)."""
    batch_T: Count = 20
    """Steps per batch, also rlpyt's store_rnn_state_interval: sequences start at batch starts (rlpyt: 40)."""
    total_frames: Count = 300_000


@dataclass
class Config(RecipeConfig):
    env: R2D1EnvConfig = field(default_factory=R2D1EnvConfig)
    collector: R2D1CollectorConfig = field(default_factory=R2D1CollectorConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    """Recurrent Q-network."""
    exploration: EpsilonGreedyConfig = field(
        default_factory=lambda: EpsilonGreedyConfig(eps_final=0.02, eps_steps=40_000, eps_eval=0.0))
    """Epsilon-greedy schedule."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Sequence replay."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Value-rescaled n-step double-Q targets."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and update cadence."""
    run: RunConfig = field(default_factory=lambda: RunConfig(torch_threads=1))
    """Run directory, seed, device; one torch thread: the per-step LSTM call is latency-bound, and a second
    thread waits on a busy core."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=10_000))
    trainer: OffPolicyTrainerConfig = field(default_factory=OffPolicyTrainerConfig)
    """sync, or async (a collector process fills the replay while this one optimises)."""


def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked
    import torch

    from tdrl.log.run import Run
    from tdrl.models import EpsilonGreedy, chain_policy
    from tdrl.models.recurrent_q import PreviousAction, make_recurrent_q_actor
    from tdrl.objectives.graphs import update_step
    from tdrl.objectives.r2d1 import R2D1Loss, input_priorities
    from tdrl.objectives.schedules import LinearSchedule
    from tdrl.objectives.update import TargetUpdate, Updater
    from tdrl.replay import PrioritizedSampler, SequenceReplayBuffer
    from tdrl.train import Schedule
    from tdrl.wiring import check_trainer, collector_factory_from, eval_collector_from, make_trainer, prepare_recipe

    check_trainer(cfg.trainer, on_policy=False)  # before any process starts
    if cfg.collector.batch_T <= cfg.loss.n_step and cfg.replay.prioritized and cfg.replay.input_priorities:
        raise ConfigError(f"collector.batch_T={cfg.collector.batch_T} must exceed loss.n_step={cfg.loss.n_step} for "
                          "input priorities (or set replay.input_priorities=false)")
    seq_len, envs = cfg.replay.warmup_T + cfg.replay.batch_T + cfg.loss.n_step, cfg.collector.batch_B
    needed = envs * (seq_len + cfg.collector.batch_T * -(-cfg.optim.batch_B // envs))
    if cfg.optim.min_steps_learn < needed:
        raise ConfigError(f"optim.min_steps_learn={cfg.optim.min_steps_learn} is below the {needed} frames after which "
                          f"{cfg.optim.batch_B} whole sequences of {seq_len} steps can be replayed")
    # --- Build ----------------------------------------------------------------------------------------------
    device, env_factory = prepare_recipe(cfg)  # starts workers early, seeds, resolves the device
    specs = env_factory.specs()
    if not specs.discrete:
        raise ConfigError(f"env.id={cfg.env.id!r} has continuous actions; R2D1 needs a discrete action space")
    actor = make_recurrent_q_actor(specs, hidden_sizes=cfg.model.hidden_sizes, lstm_size=cfg.model.lstm_size,
                                   head_sizes=cfg.model.head_sizes, dueling=cfg.model.dueling).to(device)
    exploration = EpsilonGreedy(
        specs.n_actions, eps_init=cfg.exploration.eps_init, eps_final=cfg.exploration.eps_final,
        eps_final_min=cfg.exploration.eps_final_min, n_envs=cfg.collector.batch_B,
        start_frames=cfg.optim.min_steps_learn, end_frames=cfg.exploration.eps_steps, eps_eval=cfg.exploration.eps_eval,
    ).to(device)
    # the executed action (after exploration) is fed back as prev_action
    policy = chain_policy(actor, exploration, PreviousAction(specs.n_actions))
    eps_eval = cfg.exploration.eps_eval
    eval_policy = chain_policy(actor, EpsilonGreedy(specs.n_actions, eps_init=eps_eval, eps_final=eps_eval,
                                                    eps_eval=eps_eval), PreviousAction(specs.n_actions)).to(device)

    loss = R2D1Loss(actor, gamma=cfg.loss.gamma, n_step=cfg.loss.n_step, warmup_T=cfg.replay.warmup_T,
                    double_dqn=cfg.loss.double, value_scale_eps=cfg.loss.value_scale_eps, pri_eta=cfg.replay.eta,
                    clip_reward=cfg.loss.clip_reward)
    optimizer = torch.optim.Adam(actor.parameters(), lr=cfg.optim.lr, eps=cfg.optim.adam_eps,
                                 fused=True)  # fused: a non-finite update is skipped on the device
    updater = Updater(optimizer, max_grad_norm=cfg.optim.max_grad_norm,
                      target_update=TargetUpdate(loss, interval=cfg.optim.target_update_interval))

    run = Run.open(cfg, name="r2d1")
    sampler = PrioritizedSampler(alpha=cfg.replay.alpha, beta_init=cfg.replay.beta, beta_final=cfg.replay.beta,
                                 seed=cfg.run.seed) if cfg.replay.prioritized else None
    priorities = partial(input_priorities, gamma=cfg.loss.gamma, n_step=cfg.loss.n_step, eta=cfg.replay.eta,
                         value_scale_eps=cfg.loss.value_scale_eps, clip_reward=cfg.loss.clip_reward)
    replay = SequenceReplayBuffer(run.dir / "replay", cfg.replay.size, batch_T=cfg.replay.batch_T,
                                  warmup_T=cfg.replay.warmup_T, lookahead_T=cfg.loss.n_step,
                                  rnn_state_interval=cfg.collector.batch_T, state_keys=STATE_KEYS, sampler=sampler,
                                  pri_eta=cfg.replay.eta, keys=REPLAY_KEYS + STATE_KEYS, seed=cfg.run.seed,
                                  device=device,
                                  input_priority=priorities if cfg.replay.input_priorities else None)
    collector_factory = collector_factory_from(cfg, env_factory, policy, reset_mode="wait_reset", return_same_td=True)
    eval_collector = eval_collector_from(cfg, eval_policy)
    samples_per_update = cfg.optim.batch_B * replay.seq_len  # what the replay ratio counts
    trainer = make_trainer(cfg, on_policy=False, collector_factory=collector_factory, replay=replay, policy=policy,
                           eval_collector=eval_collector, run=run,
                           schedule=Schedule.from_config(cfg, on_policy=False, batch_size=samples_per_update),
                           checkpoint_state={"loss": loss, "updater": updater, "replay": replay,
                                             "exploration": exploration})
    lr_at = LinearSchedule(cfg.optim.lr, cfg.optim.lr if cfg.optim.lr_final is None else cfg.optim.lr_final,
                           duration=cfg.collector.total_frames)

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(sample):  # the device half of an update
        out = compute_loss(sample)
        priority = out.pop("priority")
        metrics = updater.apply(out.rename_key_("loss", "loss_q"))  # logged as loss/q
        metrics["priority"] = priority
        return metrics

    learn = update_step(learn, cudagraphs=False, device=device)

    def update():
        sample = replay.sample(cfg.optim.batch_B)  # on the learner's device
        metrics = learn(sample)
        updater.advance()  # counters and the target network, on the host
        priority = metrics.pop("priority")
        if sampler is not None:  # the sum tree is on the host: the one value read back per update
            replay.update_priority(sample["index"][:, 0], priority)
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for _ in trainer:  # the trainer put the new batch into the replay (async: the collector process did)
        exploration.set_frames(trainer.frames)
        updater.lr = lr_at(trainer.frames)
        metrics = [update() for _ in range(trainer.updates_due)]
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/r2d1.py", doc=__doc__)
