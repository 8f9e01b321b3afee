"""DDPG: Deep Deterministic Policy Gradient (Lillicrap et al. 2016, arXiv:1509.02971), rlpyt's semantics on
TorchRL's DDPGLoss.

Deterministic tanh policy with Gaussian exploration noise (rlpyt's ``action_std``; no Ornstein-Uhlenbeck), one Q
critic, polyak targets for both, separate learning rates for policy and critic. Off-policy cadence as rlpyt:
``optim.replay_ratio`` sets the updates per iteration, none before ``optim.min_steps_learn`` frames. Time limits
bootstrap (``truncated``), terminals do not. Defaults reach Pendulum-v1 greedy evaluation >= -250 within 30k
frames.

    python recipes/ddpg.py                                         # Pendulum-v1
    python recipes/ddpg.py collector.kind=parallel collector.batch_B=2 collector.n_workers=2
    python recipes/ddpg.py trainer.kind=ray collector.batch_T=32    # Ape-X DPG: 4 collector actors on Ray
    python recipes/ddpg.py --help                                  # every key
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tdrl.config import (
    ActionNoiseConfig,
    ApeXTrainerConfig,
    CollectorConfig,
    ConfigError,
    ContinuousControlConfig,
    ContinuousLossConfig,
    Count,
    DeterministicPolicyOptimConfig,
    PositiveFloat,
    PositiveFraction,
    run_recipe,
)


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class OptimConfig(DeterministicPolicyOptimConfig):
    batch_size: Count = 64
    replay_ratio: PositiveFloat = 64.0
    target_update_tau: PositiveFraction = 0.01
    actor_lr: PositiveFloat = 1e-4


@dataclass
class Config(ContinuousControlConfig):
    collector: CollectorConfig = field(
        default_factory=lambda: CollectorConfig(batch_B=1, batch_T=1, total_frames=30_000))
    exploration: ActionNoiseConfig = field(default_factory=ActionNoiseConfig)
    """Exploration noise."""
    loss: ContinuousLossConfig = field(default_factory=ContinuousLossConfig)
    """DDPG objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizers and update cadence."""
    trainer: ApeXTrainerConfig = field(default_factory=ApeXTrainerConfig)
    """sync, async (a collector process fills the replay) or ray (Ape-X DPG: collector actors on Ray)."""

    def validate(self) -> None:
        super().validate()
        if self.exploration.pretrain_std is not None:  # a key DDPG would otherwise ignore
            raise ConfigError("exploration.pretrain_std is TD3's (rlpyt's Td3Agent); DDPG explores with "
                              "exploration.action_noise throughout, as rlpyt's DdpgAgent")


def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked (a bad key fails in < 1 s)
    import torch

    from tdrl.distributed import ActorHooks
    from tdrl.log.run import Run
    from tdrl.models import chain_policy, make_deterministic_actor, make_gaussian_noise, make_q_critic
    from tdrl.objectives.continuous import make_ddpg_loss, timeouts_as_terminal
    from tdrl.objectives.graphs import graph_adam, update_step
    from tdrl.objectives.update import TargetUpdate, Updater
    from tdrl.wiring import (
        collector_factory_from,
        eval_collector_from,
        make_trainer,
        prepare_off_policy,
        transition_replay_from,
    )

    # --- Build ----------------------------------------------------------------------------------------------
    # checks the trainer kind, starts workers early, seeds, resolves the device, checks the action space
    device, env_factory, specs = prepare_off_policy(cfg, algorithm="DDPG", discrete=False)
    actor = make_deterministic_actor(specs, hidden_sizes=cfg.model.hidden_sizes).to(device)
    critic = make_q_critic(specs, hidden_sizes=cfg.model.hidden_sizes).to(device)
    policy = chain_policy(actor, make_gaussian_noise(specs, std=cfg.exploration.action_noise)).to(device)
    loss = make_ddpg_loss(actor, critic, gamma=cfg.loss.gamma).to(device)
    # one optimizer, two rates: loss_actor sees the critic through detached parameters, so the sum is separable
    optimizer = graph_adam([  # the loss's parameters: they share storage with the actor's and critic's
        {"params": list(loss.actor_network_params.values(True, True)), "lr": cfg.optim.actor_lr},
        {"params": list(loss.value_network_params.values(True, True)), "lr": cfg.optim.critic_lr},
    ], lr=cfg.optim.critic_lr, device=device, cudagraphs=cfg.optim.cudagraphs)
    updater = Updater(optimizer, loss_keys=("loss_actor", "loss_qvalue"), max_grad_norm=cfg.optim.max_grad_norm,
                      target_update=TargetUpdate(loss, interval=cfg.optim.target_update_interval,
                                                 tau=cfg.optim.target_update_tau))

    run = Run.open(cfg, name="ddpg")
    replay = transition_replay_from(cfg, run.dir, device)
    # built by the trainer (async, ray: in their own processes); no copy per batch: each goes straight into the replay
    collector_factory = collector_factory_from(cfg, env_factory, policy, return_same_td=True)
    # each evaluation: n_envs whole greedy episodes on their own envs
    eval_collector = eval_collector_from(cfg, actor)
    trainer = make_trainer(cfg, on_policy=False, collector_factory=collector_factory, replay=replay, policy=policy,
                           eval_collector=eval_collector, run=run,
                           checkpoint_state={"loss": loss, "updater": updater, "replay": replay, "policy": policy},
                           actor_hooks=ActorHooks(weights_module=actor))  # ray: actors get the network, keep noise

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(sample):  # the device half of an update: optim.cudagraphs replays it from one CUDA graph
        if not cfg.loss.bootstrap_timelimit:
            timeouts_as_terminal(sample)
        return updater.apply(compute_loss(sample).rename_key_("loss_value", "loss_qvalue"))  # TD3's, SAC's column

    learn = update_step(learn, cudagraphs=cfg.optim.cudagraphs, device=device)

    def update():
        metrics = learn(replay.sample(cfg.optim.batch_size))  # the sample is on the learner's device
        updater.advance()  # counters and the target networks, on the host
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for _ in trainer:  # the trainer put the new frames into the replay
        metrics = [update() for _ in range(trainer.updates_due)]
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/ddpg.py", doc=__doc__)
