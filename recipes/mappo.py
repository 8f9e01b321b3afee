"""MAPPO and IPPO: PPO for cooperative agents (Yu et al. 2022, arXiv:2103.01955; de Witt et al. 2020,
arXiv:2011.09533) on TorchRL's ``MAPPOLoss``/``IPPOLoss``, ``MultiAgentGAE`` and ``MultiAgentMLP``.

Each agent group of the env (``tdrl.envs.multiagent``: ``(group, "observation")`` ``[B, T, n_agents, obs]``...) gets a
decentralised actor shared by its agents (``model.share_params``) and a critic: MAPPO's sees every agent of the group
(a centralised ``MultiAgentMLP``), IPPO's only its own agent. GAE runs over each agent's own reward and done flags
(``("next", group, "reward")``), advantages are normalised once per batch, per agent, and one Adam steps every
group's networks on the sum of their losses (``optim.per_group``: one Adam per group; ``optim.frozen_groups`` do not
learn: self-play against a fixed opponent). An agent that left the episode (``(group, "mask")`` False) is masked:
its rows count in no policy, value or entropy term and in no advantage statistic. Returns in the logs are summed
over all agents (mpe2's simple_spread: three times the shared team reward plus the collisions; EPyMARL divides by
the number of agents), with each group's beside them (``train/<group>/return_mean``).

    python recipes/mappo.py                                          # MAPPO on mpe2/simple_spread_v3, 3 agents
    python recipes/mappo.py loss.algorithm=ippo
    python recipes/mappo.py collector.kind=parallel collector.n_workers=2
    python recipes/mappo.py env.group_map=per_agent                  # one group (and network) per agent
    python recipes/mappo.py env.options=[N=5,local_ratio=0.3]        # the env's own arguments: 5 agents
    python recipes/mappo.py env.id=mpe2/simple_adversary_v3 optim.per_group=true optim.frozen_groups=[adversary]
    python recipes/mappo.py env.id=vmas/balance collector.kind=batched_env collector.batch_B=600  # VMAS
    python recipes/mappo.py env.id=pettingzoo/classic/tictactoe_v3       # turn-based: one move a step, self-play
    python recipes/mappo.py --help

Defaults: the MAPPO paper's MPE settings (lr 7e-4, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, one
minibatch) with 4 epochs over 8 envs x 100 steps. On one 2-core machine (seed 0, not yet a benchmark): eval return
-96 at start, about -60 (summed over the 3 agents) from 50k frames on, at ~1,900 frames/s; with 10 epochs of 4
minibatches at lr 3e-4 it oscillated between -57 and -100. Beside BenchMARL: docs/multiagent.md.

Needs ``pip install 'tdrl[marl]'``. Not yet: a global-state critic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tdrl.config import (
    CollectorConfig,
    Count,
    Fraction,
    GroupedEnvConfig,
    LayerSizes,
    LoggerConfig,
    NonNegativeFloat,
    OnPolicyTrainerConfig,
    PolicyGradientLossConfig,
    PolicyGradientOptimConfig,
    PositiveFloat,
    PositiveFraction,
    RecipeConfig,
    run_recipe,
)

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDictBase
    from tensordict.nn import TensorDictModuleBase
    from torchrl.data import TensorSpec

    from tdrl.objectives.update import Updater


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class MultiAgentEnvConfig(GroupedEnvConfig):
    id: str = "mpe2/simple_spread_v3"
    group_map: Literal["prefix", "per_agent", "one_group"] = "prefix"
    """Agent groups: by name prefix (agent_0, agent_1 -> agent), one per agent, or all in one."""


@dataclass
class ModelConfig:
    hidden_sizes: LayerSizes = field(default_factory=lambda: [64, 64])
    """Hidden layers of each agent's actor and critic MLP."""
    share_params: bool = True
    """The agents of a group share their actor's and critic's parameters."""


@dataclass
class LossConfig(PolicyGradientLossConfig):
    algorithm: Literal["mappo", "ippo"] = "mappo"
    """mappo: a group-centralised critic; ippo: each agent's critic sees its own observation."""
    gamma: PositiveFraction = 0.99
    gae_lambda: Fraction = 0.95
    clip_epsilon: PositiveFloat = 0.2
    entropy_coeff: NonNegativeFloat = 0.01
    epochs: Count = 4
    """Passes over each batch."""
    minibatches: Count = 1
    """Minibatches (of time steps, all agents of a step together) per epoch."""
    normalize_advantage: bool = True
    """Standardise each agent's advantages over the batch rows where it is present (the MAPPO paper's setting);
    false: the raw GAE advantages (BenchMARL's)."""


@dataclass
class OptimConfig(PolicyGradientOptimConfig):
    lr: PositiveFloat = 7e-4
    max_grad_norm: PositiveFloat = 5.0
    per_group: bool = False
    """One Adam per agent group, each clipping its own gradient norm (BenchMARL's layout); false: one Adam over every
    group's networks."""
    frozen_groups: list[str] = field(default_factory=list)
    """Groups whose networks do not learn: they act as built, or as resumed (self-play against a fixed opponent)."""


@dataclass
class Config(RecipeConfig):
    """MAPPO (a critic per group that sees the whole group) or IPPO (a critic per agent), loss.algorithm says which;
    the defaults are the MAPPO paper's MPE settings."""

    env: MultiAgentEnvConfig = field(default_factory=MultiAgentEnvConfig)
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_B=8, batch_T=100,
                                                                               total_frames=400_000))
    """Training collector and budget (frames count env steps, each of all agents)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=20_000))
    trainer: OnPolicyTrainerConfig = field(default_factory=OnPolicyTrainerConfig)
    """sync only (ddp is not wired up here yet)."""


# --- Model ----------------------------------------------------------------------------------------------------
def group_actor(group: str, obs_spec: TensorSpec, action_spec: TensorSpec, model: ModelConfig,
                masked: bool) -> TensorDictModuleBase:
    """The group's decentralised policy: a ``MultiAgentMLP`` to logits (discrete actions, masked by
    ``(group, "action_mask")`` where the env has one) or to a TanhNormal's location and scale (box actions)."""
    import torch
    from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
    from torchrl.data import MultiCategorical
    from torchrl.modules import MaskedCategorical, MultiAgentMLP, ProbabilisticActor, TanhNormal

    n_agents, n_obs = obs_spec.shape[-2], obs_spec.shape[-1]
    discrete = isinstance(action_spec, MultiCategorical)
    n_out = int(action_spec.nvec[0]) if discrete else 2 * action_spec.shape[-1]
    net = MultiAgentMLP(n_agent_inputs=n_obs, n_agent_outputs=n_out, n_agents=n_agents, centralized=False,
                        share_params=model.share_params, num_cells=model.hidden_sizes, activation_class=torch.nn.Tanh)
    if discrete:
        logits = TensorDictModule(net, in_keys=[(group, "observation")], out_keys=[(group, "logits")])
        in_keys = {"logits": (group, "logits"), **({"mask": (group, "action_mask")} if masked else {})}
        return ProbabilisticActor(logits, in_keys=in_keys, out_keys=[(group, "action")],
                                  distribution_class=MaskedCategorical if masked else torch.distributions.Categorical,
                                  return_log_prob=True, log_prob_key=(group, "action_log_prob"))
    params = TensorDictModule(torch.nn.Sequential(net, NormalParamExtractor()), in_keys=[(group, "observation")],
                              out_keys=[(group, "loc"), (group, "scale")])
    low, high = action_spec.space.low[0], action_spec.space.high[0]
    return ProbabilisticActor(TensorDictSequential(params), in_keys=[(group, "loc"), (group, "scale")],
                              out_keys=[(group, "action")], distribution_class=TanhNormal,
                              distribution_kwargs={"low": low, "high": high}, return_log_prob=True,
                              log_prob_key=(group, "action_log_prob"))


def group_critic(group: str, obs_spec: TensorSpec, model: ModelConfig, centralised: bool) -> TensorDictModuleBase:
    """One value per agent, ``(group, "state_value")`` ``[..., n_agents, 1]``, from every agent's observation of the
    group (MAPPO) or its own (IPPO)."""
    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.modules import MultiAgentMLP

    net = MultiAgentMLP(n_agent_inputs=obs_spec.shape[-1], n_agent_outputs=1, n_agents=obs_spec.shape[-2],
                        centralized=centralised, share_params=model.share_params, num_cells=model.hidden_sizes,
                        activation_class=torch.nn.Tanh)
    return TensorDictModule(net, in_keys=[(group, "observation")], out_keys=[(group, "state_value")])


def group_loss(group: str, actor: TensorDictModuleBase, critic: TensorDictModuleBase, cfg: Config) -> torch.nn.Module:
    """TorchRL's MAPPO/IPPO loss on the group's keys, with its ``MultiAgentGAE`` over the agents' own rewards."""
    from torchrl.objectives import IPPOLoss, MAPPOLoss
    from torchrl.objectives.value import MultiAgentGAE

    cls = MAPPOLoss if cfg.loss.algorithm == "mappo" else IPPOLoss
    loss = cls(actor, critic, clip_epsilon=cfg.loss.clip_epsilon, entropy_coeff=cfg.loss.entropy_coeff,
               critic_coeff=cfg.loss.value_loss_coeff, normalize_advantage=False)  # advantages(): masked
    # the policy, value and entropy terms average over the rows whose agent is present (TorchRL's public loss mask;
    # a wait-reset collector's idle steps are zeros, so their agents are absent too)
    loss.loss_mask_key = (group, "mask")
    loss.make_value_estimator(MultiAgentGAE, gamma=cfg.loss.gamma, lmbda=cfg.loss.gae_lambda, value_network=critic)
    keys = dict(value=(group, "state_value"), advantage=(group, "advantage"), value_target=(group, "value_target"),
                reward=(group, "reward"), done=(group, "done"), terminated=(group, "terminated"))
    loss.set_keys(action=(group, "action"), sample_log_prob=(group, "action_log_prob"), **keys)
    loss.value_estimator.set_keys(**keys)
    return loss


def advantages(batch: TensorDictBase, losses: dict[str, Any], standardize: bool = True) -> None:
    """Each group's ``(group, "advantage")`` and ``(group, "value_target")`` by its loss's ``MultiAgentGAE`` over
    the agents' own rewards and done flags (an agent that left stays done, so its absent rows never reach a present
    one's advantage), then (``standardize``) the advantages standardised per agent over the rows where it is present
    (TorchRL's ``normalize_advantage`` would count the absent rows too)."""
    import torch

    for g, loss in losses.items():  # the per-agent reward and done flags the estimators read, beside the values
        for key in ("reward", "done", "terminated"):
            batch[g, key] = batch["next", g, key]
        with torch.no_grad():
            loss.value_estimator(batch)
            if standardize:
                batch[g, "advantage"] = standardize_present(batch[g, "advantage"], batch[g, "mask"])


def standardize_present(adv: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``[..., n_agents, 1]`` advantages less their mean over the present rows, over their (unbiased) standard
    deviation, per agent (TorchRL's standardisation, restricted to ``present``); 0 on absent rows."""
    import torch

    keep = present.unsqueeze(-1).expand_as(adv)
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    dims = [d for d in range(adv.dim()) if d != adv.dim() - 2]
    count = keep.sum(dims, keepdim=True)
    mean = adv.sum(dims, keepdim=True) / count.clamp_min(1)
    var = torch.where(keep, adv - mean, torch.zeros_like(adv)).pow(2).sum(dims, keepdim=True) / (count - 1).clamp_min(1)
    return torch.where(keep, (adv - mean) / var.sqrt().clamp_min(torch.finfo(torch.float).resolution), adv)


def trained_groups(groups: list[str], frozen: list[str]) -> list[str]:
    """The groups that learn: all but ``optim.frozen_groups``, which must name groups of the env."""
    from tdrl.utils.errors import UserError

    if unknown := sorted(set(frozen) - set(groups)):
        raise UserError(f"optim.frozen_groups names {unknown}; this env's agent groups are {groups}")
    if not (trained := [g for g in groups if g not in frozen]):
        raise UserError(f"optim.frozen_groups freezes every agent group ({groups}): nothing would learn")
    return trained


def group_updaters(losses: dict[str, Any], trained: list[str], optim: OptimConfig) -> dict[str, Updater]:
    """``{"": one Updater}`` over the trained groups' networks, or with ``optim.per_group`` one per group."""
    import torch

    from tdrl.objectives.update import Updater

    def updater(names: list[str]) -> Updater:
        params = [p for g in names for p in losses[g].parameters()]
        return Updater(torch.optim.Adam(params, lr=optim.lr, eps=optim.eps), max_grad_norm=optim.max_grad_norm)

    return {g: updater([g]) for g in trained} if optim.per_group else {"": updater(trained)}


def summed(terms: list[TensorDictBase]) -> dict[str, torch.Tensor]:
    """The ``loss_*`` terms of several groups' losses, summed key by key."""
    return {key: sum(t[key] for t in terms) for key in terms[0].keys() if key.startswith("loss_")}


def per_group_metrics(steps: dict[str, TensorDictBase]) -> TensorDictBase:
    """One metrics row from per-group updates: the loss terms summed over groups, each group's ``grad_norm_<g>``."""
    from tensordict import TensorDict

    row = summed(list(steps.values()))
    grad_norms = {f"grad_norm_{g}": s["grad_norm"] for g, s in steps.items()}
    return TensorDict({**row, **grad_norms, "lr": next(iter(steps.values()))["lr"]})


def minibatches(data: TensorDictBase, n: int) -> list[TensorDictBase]:
    import torch

    return [data] if n == 1 else [data[idx] for idx in torch.randperm(data.shape[0]).chunk(n)]


# --- Recipe ---------------------------------------------------------------------------------------------------
def main(cfg: Config) -> dict:
    import torch
    from tensordict.nn import TensorDictSequential

    from tdrl.collect import make_eval_collector
    from tdrl.collect.layout import group_keys
    from tdrl.envs import EnvFactory
    from tdrl.log.run import Run
    from tdrl.wiring import check_trainer, collector_factory_from, make_trainer, prepare_recipe

    check_trainer(cfg.trainer, on_policy=True, supported=("sync",))
    # --- Build ----------------------------------------------------------------------------------------------
    device, _ = prepare_recipe(cfg)
    env_kwargs = {**cfg.env.kwargs(), "group_map": cfg.env.group_map}
    env_factory = EnvFactory(cfg.env.id, env_kwargs)
    specs = env_factory.specs()  # an unknown id, a missing extra or a bad group map: one line, exit 2
    obs_spec = specs.observation_spec
    groups = [g for g in group_keys(obs_spec.zero((1,))) if isinstance(g, str)]
    actors: dict[str, TensorDictModuleBase] = {}
    critics: dict[str, TensorDictModuleBase] = {}
    losses: dict[str, Any] = {}  # TorchRL's MAPPOLoss/IPPOLoss
    for g in groups:
        masked = "action_mask" in obs_spec[g].keys()
        actors[g] = group_actor(g, obs_spec[g, "observation"], specs.action_spec[g, "action"], cfg.model, masked)
        critics[g] = group_critic(g, obs_spec[g, "observation"], cfg.model, cfg.loss.algorithm == "mappo")
        losses[g] = group_loss(g, actors[g], critics[g], cfg)
    policy = TensorDictSequential(*actors.values()).to(device)  # every group acts each step
    loss_modules = torch.nn.ModuleDict(losses).to(device)
    trained = trained_groups(groups, cfg.optim.frozen_groups)  # a group the env lacks: one line, exit 2
    updaters = group_updaters(losses, trained, cfg.optim)

    run = Run.open(config=cfg, run=cfg.run, logger=cfg.logger, checkpoint=cfg.checkpoint, name=cfg.loss.algorithm,
                   total_frames=cfg.collector.total_frames)
    collector = collector_factory_from(cfg, env_factory, policy, device=device)()
    eval_collector = make_eval_collector(cfg.env.id, policy, n_envs=cfg.eval.n_envs, max_steps=cfg.eval.max_steps,
                                         seed=cfg.run.seed + 10_000, discount=cfg.loss.gamma, env_kwargs=env_kwargs)
    trainer = make_trainer(cfg, on_policy=True, collector=collector, modules=[loss_modules],
                           eval_collector=eval_collector, run=run,
                           checkpoint_state={"model": loss_modules, **{f"updater_{g}" if g else "updater": u
                                                                        for g, u in updaters.items()}})

    # --- Update ---------------------------------------------------------------------------------------------
    def update(batch: TensorDictBase) -> list[TensorDictBase]:
        # (group, "advantage"), (group, "value_target")
        advantages(batch, {g: losses[g] for g in trained}, cfg.loss.normalize_advantage)
        data = batch.reshape(-1)  # [B * T] steps, each with its [n_agents] group rows
        metrics = []
        for _ in range(cfg.loss.epochs):
            for minibatch in minibatches(data, cfg.loss.minibatches):
                terms = {g: losses[g](minibatch) for g in trained}
                steps = {name: u.apply(summed([terms[g] for g in ([name] if name else trained)]))
                         for name, u in updaters.items()}
                for u in updaters.values():
                    u.advance()
                metrics.append(steps[""] if "" in steps else per_group_metrics(steps))
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    for batch in trainer:
        metrics = update(batch)
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/mappo.py", doc=__doc__)
