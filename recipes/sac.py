"""SAC: Soft Actor-Critic (Haarnoja et al. 2018, arXiv:1812.05905), rlpyt's semantics, TorchRL's SACLoss objective.

Tanh-squashed Gaussian policy, twin Q critics with polyak targets, automatic entropy tuning towards ``-action_dim``
(measured in the [-1, 1]-rescaled action space, as SB3 and the paper's [-1, 1] tasks). The loss is tdrl's
``TwinQSACLoss``: TorchRL's SACLoss terms (equal values and gradients, tested) with the twin critics stacked into one
batched matmul per layer (faster than TorchRL's SACLoss on CPU: benchmarks/learning.py --losses sac). Each update
steps the critics first, then the policy and alpha against the updated critics (SB3's order). Off-policy cadence as
rlpyt: ``optim.replay_ratio`` (samples drawn per env frame; 256 with batch 256 = one update per frame) sets the
updates per iteration, none before ``optim.min_steps_learn`` frames. Time limits bootstrap (``truncated``), terminals
do not (``loss.bootstrap_timelimit=false`` treats both as terminal). Defaults solve Pendulum-v1 (greedy evaluation >=
-200) within 20k frames.

    python recipes/sac.py                                          # Pendulum-v1
    python recipes/sac.py collector.kind=parallel collector.batch_B=2 collector.n_workers=2
    python recipes/sac.py trainer.kind=async                       # collect and optimise in two processes
    python recipes/sac.py --help                                   # every key

MuJoCo (benchmark, not CI)::

    python recipes/sac.py env.id=HalfCheetah-v5 collector.total_frames=1000000 optim.lr=3e-4 \
        optim.min_steps_learn=10000 replay.size=1000000 logger.log_interval_steps=10000
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tdrl.config import (
    AnyFloat,
    ContinuousControlConfig,
    ContinuousLossConfig,
    Count,
    OffPolicyOptimConfig,
    OffPolicyTrainerConfig,
    PositiveFloat,
    RunConfig,
    run_recipe,
)


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class LossConfig(ContinuousLossConfig):
    alpha_init: PositiveFloat = 1.0
    """Initial entropy temperature."""
    fixed_alpha: bool = False
    """Keep alpha at alpha_init instead of tuning it (rlpyt fixed_alpha)."""
    target_entropy: AnyFloat | None = None
    """Entropy target of the alpha tuning; None: -action_dim for actions rescaled to [-1, 1] (SB3's convention)."""


@dataclass
class OptimConfig(OffPolicyOptimConfig):
    min_steps_learn: Count = 100
    """Env frames collected (with the initial policy) before the first update (rlpyt 10000; SB3 100); may be below
    batch_size: the replay draws with replacement."""
    lr: PositiveFloat = 1e-3
    """Adam learning rate of the policy, the critics and alpha (rlpyt 3e-4; RL-Zoo Pendulum 1e-3)."""


@dataclass
class Config(ContinuousControlConfig):
    loss: LossConfig = field(default_factory=LossConfig)
    """SAC objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and update cadence."""
    run: RunConfig = field(default_factory=lambda: RunConfig(torch_threads=2))
    """Run directory, seed, device; 2 torch threads:
    a 256-wide twin-critic update is ~1.4x faster on 2 threads than on 1 (measured, 2 cores)."""
    trainer: OffPolicyTrainerConfig = field(default_factory=OffPolicyTrainerConfig)
    """sync, or async (trainer.kind=async: a collector process fills the replay while this one optimises)."""


def main(cfg: Config) -> dict:
    # torch, TorchRL and the envs load here, after the config is checked (a bad key fails in < 1 s)
    import torch

    from tdrl.log.run import Run
    from tdrl.models.q import make_tanh_gaussian_actor, make_twin_q
    from tdrl.objectives.continuous import timeouts_as_terminal
    from tdrl.objectives.graphs import graph_adam, update_step
    from tdrl.objectives.sac import TwinQSACLoss
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
    device, env_factory, specs = prepare_off_policy(cfg, algorithm="SAC", discrete=False)
    actor = make_tanh_gaussian_actor(specs, hidden_sizes=cfg.model.hidden_sizes).to(device)
    half_width = (specs.action_spec.space.high - specs.action_spec.space.low).float() / 2
    # default: -action_dim in the [-1, 1]-normalised action space (the paper's and SB3's target), whatever the units
    target_entropy = cfg.loss.target_entropy
    if target_entropy is None:
        target_entropy = float(half_width.log().sum()) - half_width.numel()
    # TorchRL's SACLoss terms (equal values and gradients: tests/objectives/test_continuous_sac.py), with the twin
    # critics stacked into one batched matmul per layer and read actions rescaled to [-1, 1]
    critic = make_twin_q(specs, hidden_sizes=cfg.model.hidden_sizes)
    loss = TwinQSACLoss(actor, critic, gamma=cfg.loss.gamma, alpha_init=cfg.loss.alpha_init,
                        fixed_alpha=cfg.loss.fixed_alpha, target_entropy=target_entropy).to(device)
    critic_params = list(critic.parameters())
    policy_params = [*actor.parameters(), *([] if cfg.loss.fixed_alpha else [loss.log_alpha])]
    def adam(params):
        return graph_adam(params, lr=cfg.optim.lr, device=device, cudagraphs=cfg.optim.cudagraphs)

    critic_updater = Updater(adam(critic_params), loss_keys=("loss_qvalue",), max_grad_norm=cfg.optim.max_grad_norm)
    policy_updater = Updater(adam(policy_params),
                             loss_keys=("loss_actor", "loss_alpha"), max_grad_norm=cfg.optim.max_grad_norm,
                             target_update=TargetUpdate(loss, interval=cfg.optim.target_update_interval,
                                                        tau=cfg.optim.target_update_tau))

    run = Run.open(cfg, name="sac")
    replay = transition_replay_from(cfg, run.dir, device)
    # built by the trainer (async: in its own process); no copy per batch: each goes straight into the replay
    collector_factory = collector_factory_from(cfg, env_factory, actor, return_same_td=True)
    # each evaluation: n_envs whole greedy episodes on their own envs
    eval_collector = eval_collector_from(cfg, actor)
    trainer = make_trainer(cfg, on_policy=False, collector_factory=collector_factory, replay=replay, policy=actor,
                           eval_collector=eval_collector, run=run,
                           checkpoint_state={"loss": loss, "critic_updater": critic_updater,
                                             "policy_updater": policy_updater, "replay": replay})

    # --- Update ---------------------------------------------------------------------------------------------
    critic_loss, actor_loss = loss.critic_loss, loss.actor_loss
    if cfg.optim.compile:
        critic_loss, actor_loss = torch.compile(critic_loss), torch.compile(actor_loss)

    def learn(sample):  # the device half of an update: optim.cudagraphs replays it from one CUDA graph
        if not cfg.loss.bootstrap_timelimit:
            timeouts_as_terminal(sample)
        critic_metrics = critic_updater.apply(critic_loss(sample))
        metrics = policy_updater.apply(actor_loss(sample))  # against the critics updated just now (SB3's order)
        metrics["loss_qvalue"], metrics["grad_norm_critic"] = critic_metrics["loss_qvalue"], critic_metrics["grad_norm"]
        return metrics

    learn = update_step(learn, cudagraphs=cfg.optim.cudagraphs, device=device)

    def update():
        metrics = learn(replay.sample(cfg.optim.batch_size))  # the sample is on the learner's device
        critic_updater.advance()
        policy_updater.advance()  # and the target critics
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for _ in trainer:  # the trainer put the new frames into the replay (async: the collector process did)
        metrics = [update() for _ in range(trainer.updates_due)]
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/sac.py", doc=__doc__)
