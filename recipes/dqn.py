"""DQN family: DQN (Mnih et al. 2015), double DQN (van Hasselt et al. 2016), dueling heads (Wang et al. 2016),
n-step returns, prioritized replay (Schaul et al. 2016) and categorical DQN / C51 (Bellemare et al. 2017) — the
"Rainbow minus noisy nets" set of rlpyt's CategoricalDQN — chosen by config, on TorchRL's DQN losses.

rlpyt semantics: ``optim.replay_ratio`` (samples drawn per env frame) sets the gradient updates per iteration,
no update before ``optim.min_steps_learn`` frames, ``optim.target_update_interval`` counts gradient updates,
epsilon stays at ``eps_init`` until ``min_steps_learn`` and then falls linearly to ``eps_final`` at
``exploration.eps_steps`` (per env with ``exploration.eps_final_min``: vector epsilon), evaluation with
``eps_eval``. Time limits bootstrap (``truncated``), terminals do not. Defaults (double + dueling, 3-step
returns) solve CartPole-v1 (greedy evaluation 500) within 100k frames. ``loss.clip_reward=true`` clips each step's
reward to [-1, 1] before the replay sums n-step returns (rlpyt's Atari clipping); TrajInfos keep the raw score. With
``env.episodic_lives=true`` a lost life ends the agent's episode (no bootstrap across it), while training TrajInfos
span the whole game and evaluation plays whole games: ``train/`` and ``eval/return_mean`` are game scores.

    python recipes/dqn.py                                          # double + dueling DQN, CartPole-v1
    python recipes/dqn.py model.categorical=true                   # C51 (+ double, dueling, n-step)
    python recipes/dqn.py replay.prioritized=true                  # + prioritized replay
    python recipes/dqn.py collector.kind=parallel collector.batch_B=2 collector.n_workers=2
    python recipes/dqn.py trainer.kind=async                       # collect and optimise in two processes
    python recipes/dqn.py trainer.kind=ray replay.prioritized=true # Ape-X: 4 collector actors on Ray, one learner
    python recipes/dqn.py --help                                   # every key

Atari (rlpyt's defaults; needs ``pip install 'tdrl[atari]'``)::

    python recipes/dqn.py env.id=ALE/Pong-v5 env.episodic_lives=true loss.clip_reward=true \
        collector.total_frames=10000000 collector.batch_B=8 collector.batch_T=2 replay.size=1000000 \
        optim.min_steps_learn=50000 exploration.eps_steps=1000000 exploration.eps_final=0.01 optim.lr=2.5e-4 \
        optim.lr_final=none optim.batch_size=32 optim.replay_ratio=8 optim.target_update_interval=312 \
        loss.n_step=1 model.v_min=-10 model.v_max=10 eval.max_steps=27000 logger.log_interval_steps=100000
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from tdrl.config import (
    AnyFloat,
    ApeXEpsilonGreedyConfig,
    ApeXTrainerConfig,
    AtariEnvConfig,
    CollectorConfig,
    ConfigError,
    Count,
    LayerSizes,
    LoggerConfig,
    NonNegativeFloat,
    OffPolicyLossConfig,
    OffPolicyOptimConfig,
    PositiveFloat,
    PositiveFraction,
    PrioritizedReplayConfig,
    Range,
    RecipeConfig,
    RunConfig,
    check_devices,
    run_recipe,
)


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    hidden_sizes: LayerSizes = field(default_factory=lambda: [256, 256])
    """MLP torso widths for vector observations (images get the Nature-DQN conv torso)."""
    dueling: bool = True
    """Dueling head: Q = V + A - mean(A)."""
    categorical: bool = False
    """Categorical DQN (C51): learn the return distribution on a fixed support."""
    n_atoms: Annotated[int, Range(ge=2)] = 51
    """Atoms of the C51 support."""
    v_min: AnyFloat = 0.0
    """Lowest C51 atom (rlpyt V_min; -10 for clipped-reward Atari)."""
    v_max: AnyFloat = 100.0
    """Highest C51 atom (rlpyt V_max; 10 for clipped-reward Atari; CartPole's discounted return is <= 100)."""

    def validate(self) -> None:
        if not self.v_min < self.v_max:
            raise ConfigError(f"model.v_min={self.v_min} must be < model.v_max={self.v_max} (the C51 support)")


@dataclass
class LossConfig(OffPolicyLossConfig):
    n_step: Count = 3
    double: bool = True
    """Double DQN: online network selects the bootstrap action, target network evaluates it (C51: always)."""
    loss_function: Literal["huber", "mse"] = "huber"
    """Huber (rlpyt delta_clip=1) or squared error (delta_clip=None); C51 uses cross-entropy."""
    clip_reward: bool = False
    """Clip each step's reward to [-1, 1] before n-step sums (rlpyt's Atari setting; TrajInfos stay raw)."""


@dataclass
class OptimConfig(OffPolicyOptimConfig):
    batch_size: Count = 64
    replay_ratio: PositiveFloat = 32.0
    target_update_interval: Count = 128
    """Gradient updates between target-network updates (rlpyt counts updates, not frames)."""
    target_update_tau: PositiveFraction = 1.0
    max_grad_norm: PositiveFloat | None = 10.0
    lr: PositiveFloat = 2.3e-3
    """Adam learning rate (RL-Zoo's CartPole value; rlpyt's Atari default is 2.5e-4)."""
    lr_final: NonNegativeFloat | None = 1e-4
    """Decay the learning rate linearly to this over the run; None keeps it constant."""
    adam_eps: PositiveFloat = 0.01 / 64
    """Adam epsilon (rlpyt: 0.01 / batch_size)."""


@dataclass
class Config(RecipeConfig):
    env: AtariEnvConfig = field(default_factory=AtariEnvConfig)
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_B=1, batch_T=8))
    model: ModelConfig = field(default_factory=ModelConfig)
    """Q-network."""
    exploration: ApeXEpsilonGreedyConfig = field(default_factory=ApeXEpsilonGreedyConfig)
    """Epsilon-greedy schedule."""
    replay: PrioritizedReplayConfig = field(default_factory=PrioritizedReplayConfig)
    """Replay buffer."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Q-learning target and loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and update cadence."""
    run: RunConfig = field(default_factory=lambda: RunConfig(torch_threads=2))
    """Run directory, seed, device; 2 torch threads:
    the 256-wide dueling update is ~10% faster on 2 threads than on 1 (measured, 2 cores)."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=5_000))
    trainer: ApeXTrainerConfig = field(default_factory=ApeXTrainerConfig)
    """sync, or async (trainer.kind=async: a collector process fills the replay while this one optimises)."""

    def validate(self) -> None:
        check_devices(self)


def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked (a bad key fails in < 1 s)
    import torch

    from tdrl.distributed import ActorHooks, module_path
    from tdrl.log.run import Run
    from tdrl.models import ApexEpsilons, EpsilonGreedy, chain_policy, make_q_actor
    from tdrl.objectives.dqn import ActorPriorities, dqn_priorities, make_dqn_loss
    from tdrl.objectives.graphs import graph_adam, update_step
    from tdrl.objectives.schedules import LinearSchedule
    from tdrl.objectives.update import TargetUpdate, Updater
    from tdrl.replay import FrameStack, PrioritizedSampler
    from tdrl.wiring import (
        collector_factory_from,
        eval_collector_from,
        make_trainer,
        prepare_off_policy,
        transition_replay_from,
    )

    # --- Build ----------------------------------------------------------------------------------------------
    # checks the trainer kind, starts workers early, seeds, resolves the device, checks the action space
    device, env_factory, specs = prepare_off_policy(cfg, algorithm="DQN", discrete=True)
    n_atoms = cfg.model.n_atoms if cfg.model.categorical else 1
    if cfg.model.categorical and not cfg.loss.double:
        raise ConfigError("loss.double=false with model.categorical=true: TorchRL's C51 loss always selects the "
                          "bootstrap action with the online network; set loss.double=true")
    q_actor = make_q_actor(specs, hidden_sizes=cfg.model.hidden_sizes, dueling=cfg.model.dueling, n_atoms=n_atoms,
                           v_min=cfg.model.v_min, v_max=cfg.model.v_max).to(device)
    exploration = EpsilonGreedy(
        specs.n_actions, eps_init=cfg.exploration.eps_init, eps_final=cfg.exploration.eps_final,
        eps_final_min=cfg.exploration.eps_final_min, n_envs=cfg.collector.batch_B,
        start_frames=cfg.optim.min_steps_learn, end_frames=cfg.exploration.eps_steps, eps_eval=cfg.exploration.eps_eval,
    ).to(device)
    policy = chain_policy(q_actor, exploration)
    eps_eval = cfg.exploration.eps_eval  # evaluation acts with its own scalar epsilon, whatever the envs
    eval_policy = chain_policy(q_actor, EpsilonGreedy(specs.n_actions, eps_init=eps_eval, eps_final=eps_eval,
                                                              eps_eval=eps_eval)).to(device)

    loss = make_dqn_loss(q_actor, gamma=cfg.loss.gamma, double_dqn=cfg.loss.double,
                         loss_function=cfg.loss.loss_function)
    target_update = TargetUpdate(loss, interval=cfg.optim.target_update_interval, tau=cfg.optim.target_update_tau)
    optimizer = graph_adam(q_actor.parameters(), lr=cfg.optim.lr, device=device, cudagraphs=cfg.optim.cudagraphs,
                           eps=cfg.optim.adam_eps)
    updater = Updater(optimizer, max_grad_norm=cfg.optim.max_grad_norm,
                      target_update=target_update)
    delta_clip = 1.0 if cfg.loss.loss_function == "huber" else None

    run = Run.open(cfg, name="dqn")
    sampler = PrioritizedSampler(alpha=cfg.replay.alpha, beta_init=cfg.replay.beta_init,
                                 beta_final=cfg.replay.beta_final, beta_steps=cfg.replay.beta_steps,
                                 seed=cfg.run.seed) if cfg.replay.prioritized else None
    # a frame-stack family (Atari): each 84x84 frame stored once, not in 8 stacks (rlpyt's frame buffer; 7.5 GB per
    # 1M steps, not 56.5)
    frames = env_factory.traits.frame_stack
    frame_stack = FrameStack(frames, padding="reset") if frames else None
    if frame_stack is not None and cfg.replay.device == "cuda":
        raise ConfigError("replay.device=cuda keeps a copy of the replay on the GPU, which the Atari replay (each "
                          "frame stored once, on the host) does not have; use replay.device=auto or cpu")
    replay = transition_replay_from(cfg, run.dir, device, sampler=sampler, frame_stack=frame_stack,
                                    clip_reward=cfg.loss.clip_reward)  # the loss sees clipped rewards
    # built by the trainer (async: in its own process); no copy per batch: each goes straight into the replay
    collector_factory = collector_factory_from(cfg, env_factory, policy, return_same_td=True)
    # each evaluation: n_envs whole episodes on their own envs, epsilon = exploration.eps_eval
    eval_collector = eval_collector_from(cfg, eval_policy)
    trainer = make_trainer(cfg, on_policy=False, collector_factory=collector_factory, replay=replay, policy=policy,
                           eval_collector=eval_collector, run=run,
                           checkpoint_state={"loss": loss, "updater": updater, "replay": replay,
                                             "exploration": exploration},  # epsilon resumes where it was
                           # ray (Ape-X): actors get the Q-network only, keep their own fixed epsilons and compute
                           # their batches' initial priorities
                           actor_hooks=ActorHooks(
                               weights_module=q_actor,
                               setup=ApexEpsilons(cfg.exploration.actor_eps, cfg.exploration.actor_eps_alpha),
                               priorities=ActorPriorities(gamma=cfg.loss.gamma, n_step=cfg.loss.n_step,
                                                          q_path=module_path(policy, q_actor), delta_clip=delta_clip)
                               if sampler is not None and not cfg.model.categorical else None))
    lr_at = LinearSchedule(cfg.optim.lr, cfg.optim.lr if cfg.optim.lr_final is None else cfg.optim.lr_final,
                           duration=cfg.collector.total_frames)

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(sample):  # the device half of an update: optim.cudagraphs replays it from one CUDA graph
        metrics = updater.apply(compute_loss(sample).rename_key_("loss", "loss_q"))  # logged as loss/q
        if sampler is not None:
            metrics["priority"] = dqn_priorities(sample, categorical=cfg.model.categorical, delta_clip=delta_clip)
        return metrics

    learn = update_step(learn, cudagraphs=cfg.optim.cudagraphs, device=device)

    def update():
        sample = replay.sample(cfg.optim.batch_size)  # on the learner's device
        metrics = learn(sample)
        updater.advance()  # counters and the target network, on the host
        if sampler is not None:  # the sum tree is on the host: the one value read back per update
            replay.update_priority(sample["index"], metrics.pop("priority"))
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for _ in trainer:  # the trainer put the new frames into the replay (async: the collector process did)
        exploration.set_frames(trainer.frames)  # epsilon of the next batch (synced to collector copies)
        updater.lr = lr_at(trainer.frames)
        metrics = [update() for _ in range(trainer.updates_due)]
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/dqn.py", doc=__doc__)
