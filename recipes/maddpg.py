"""MADDPG and MASAC: off-policy actor-critics for agents with continuous actions (Lowe et al. 2017,
arXiv:1706.02275; MASAC: SAC, Haarnoja et al. 2018, with MADDPG's centralised critics) on TorchRL's ``DDPGLoss`` and
``SACLoss``, with ``MultiAgentMLP`` actors and critics as TorchRL's multi-agent examples build them.

All agents of the env form one group (``(agents, "observation")`` ``[B, T, n_agents, obs]``...,
``tdrl.envs.multiagent``'s ``group_map=one_group``; they must share their spaces). Each agent acts on its own
observation (decentralised actors, shared by the agents with ``model.share_params``), and agent i's critic
``Q_i(o_j, a_j for j in visible_i)`` sees the observations and actions of the agents ``model.critic_visible_agents``
names (Machin's ``critic_visible_actors``): by default every agent (MADDPG), ``[[0], [1], [2]]`` its own (independent
DDPG/SAC), ``[[0, 1], [1, 2], [2, 0]]`` a ring. Each critic learns its own agent's reward, ``("next", agents,
"reward")``; an agent's rows train only while it is present (``(agents, "mask")`` is the losses' mask).

- ``loss.algorithm=maddpg``: deterministic tanh actors with Gaussian exploration noise annealed over
  ``exploration.sigma_frames``; ``Q_i -> r_i + gamma * Q'_i(o', mu'(o'))``, actors ascend ``Q_i(o, mu(o))``.
- ``loss.algorithm=masac``: tanh-Gaussian actors, twin critics, the soft target and a learned entropy temperature
  (one for all agents, towards ``-action_dim`` per agent in the [-1, 1]-rescaled action space).

Target networks are polyak averages (``optim.target_update_tau``). Returns in the logs are **summed over the
agents** (mpe2's simple_spread, ``local_ratio=0.5``: 1.5 times the shared landmark reward plus half of all collisions;
EPyMARL divides MPE returns by the number of agents).

    python recipes/maddpg.py                                      # MADDPG on mpe2/simple_spread_v3, continuous
    python recipes/maddpg.py loss.algorithm=masac
    python recipes/maddpg.py model.critic_visible_agents=[[0,1],[1,2],[2,0]]  # a ring of critics
    python recipes/maddpg.py collector.kind=parallel collector.n_workers=2
    python recipes/maddpg.py env.id=vmas/sampling collector.kind=batched_env loss.algorithm=masac
    python recipes/maddpg.py --help

Defaults: the MADDPG paper's MPE settings where they fit one 2-core machine (two hidden layers of 64, gamma 0.95,
polyak 0.01, a replay of 1e6) with DDPG's learning rates (actors 1e-4, critics 1e-3) and one update of 256
transitions per 8 env steps; exploration noise 0.3 -> 0.05 of the half-width over the first 50k frames (with
TorchRL's example's 1.0 -> 0.1 the greedy return fell to -180...-210 by 20k frames, actors at 1e-3 or 1e-4, measured
with TanhDelta actors: see group_actor).

Measured (one 2-core machine shared with other jobs, seed 0, not yet a benchmark; greedy eval return of 10 episodes,
summed over the 3 agents; -67 at start, where the untrained actors hold every agent still):

- MADDPG, 100k frames (~500 s): -67, -53, -83, -70, -72, -65, -59, -70, -53, -57, -55 every 10k frames;
  the noisy training episodes -74 -> -57.
- MASAC, 100k frames (~900 s): -70, -53, -63, -58, -69, -64, -49, -62, -50, -52, -60; training episodes
  -76 -> -58.

Both hover near -55 from 60k frames on, a little better than standing still; MAPPO's recipe reaches about -60
on the same task, VDN about -54. tests/recipes/test_maddpg.py::test_learns_simple_spread (slow) holds the last
three evaluations' mean above -62.

Needs ``pip install 'tdrl[marl]'``. Not yet: several groups (adversaries), ``trainer.kind=async``, n-step returns
(the replay sums the team's reward, not each agent's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tdrl.config import (
    AnyFloat,
    CollectorConfig,
    ConfigError,
    Count,
    DeterministicPolicyOptimConfig,
    GroupedEnvConfig,
    LayerSizes,
    LoggerConfig,
    NonNegativeFloat,
    NonNegativeInt,
    OffPolicyLossConfig,
    OffPolicyTrainerConfig,
    PositiveFloat,
    PositiveFraction,
    RecipeConfig,
    ReplayConfig,
    check_devices,
    run_recipe,
)

GROUP = "agents"  # group_map=one_group: every agent in this one group

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDictBase
    from tensordict.nn import TensorDictModuleBase
    from torchrl.data import TensorSpec


# --- Config ---------------------------------------------------------------------------------------------------
@dataclass
class MultiAgentEnvConfig(GroupedEnvConfig):
    id: str = "mpe2/simple_spread_v3"
    """A multi-agent env id with continuous actions (mpe2/..., vmas/... with collector.kind=batched_env);
    simple_spread: 3 agents, 25-step episodes."""
    continuous_actions: bool = True
    """Build the env with continuous_actions=True (mpe2's and VMAS's switch to Box actions); false for an env
    without the switch."""


@dataclass
class ModelConfig:
    hidden_sizes: LayerSizes = field(default_factory=lambda: [64, 64])
    """Hidden layers of each actor and critic MLP (the MADDPG paper: two of 64)."""
    share_params: bool = True
    """The agents share one actor."""
    share_critic_params: bool = True
    """The agents' critics share their parameters (each still reads its own visible agents)."""
    critic_visible_agents: list[list[NonNegativeInt]] | None = None
    """Per agent, the agents (indices into the env's agents) whose observations and actions its critic sees
    (Machin's critic_visible_actors), e.g. [[0,1],[1,2],[2,0]]; None: every agent (MADDPG)."""


@dataclass
class LossConfig(OffPolicyLossConfig):
    algorithm: Literal["maddpg", "masac"] = "maddpg"
    """maddpg: deterministic actors and Gaussian noise; masac: tanh-Gaussian actors, twin critics, entropy."""
    gamma: PositiveFraction = 0.95
    """Discount per env step (the MADDPG paper's MPE setting)."""
    alpha_init: PositiveFloat = 1.0
    """masac: initial entropy temperature."""
    fixed_alpha: bool = False
    """masac: keep alpha at alpha_init."""
    target_entropy: AnyFloat | None = None
    """masac: per-agent entropy target; None: -action_dim for actions rescaled to [-1, 1]."""

    def validate(self) -> None:
        if self.n_step > 1:
            raise ConfigError(f"loss.n_step={self.n_step}: the replay sums n-step returns of the team reward, and "
                              "each critic here learns its own agent's; use loss.n_step=1")


@dataclass
class ExplorationConfig:
    """maddpg's Gaussian action noise (TorchRL's AdditiveGaussianModule), its std relative to the half-width of
    the action box, annealed linearly (masac explores by sampling its policy)."""

    sigma_init: NonNegativeFloat = 0.3
    """Noise std at the start."""
    sigma_final: NonNegativeFloat = 0.05
    """Noise std after sigma_frames env frames."""
    sigma_frames: Count = 50_000
    """Env frames over which the std falls linearly."""

    def validate(self) -> None:
        if self.sigma_final > self.sigma_init:
            raise ConfigError(f"exploration.sigma_final={self.sigma_final} must be <= exploration.sigma_init="
                              f"{self.sigma_init} (the noise anneals down)")


@dataclass
class OptimConfig(DeterministicPolicyOptimConfig):
    actor_lr: PositiveFloat = 1e-4
    """Adam learning rate of the actors (DDPG's 1e-4; critics: critic_lr, 1e-3)."""
    batch_size: Count = 256
    """Transitions per update (each with every agent's row)."""
    replay_ratio: PositiveFloat = 32.0
    """Transitions sampled per transition collected: 32 = one update of 256 per 8 env steps."""
    min_steps_learn: Count = 1_000
    """Env frames collected (with the initial policy and its noise) before the first update."""
    target_update_tau: PositiveFraction = 0.01
    """Polyak factor of the target networks (the MADDPG paper's 0.01)."""
    max_grad_norm: PositiveFloat | None = 10.0
    """Gradient norm clip over all networks."""


@dataclass
class Config(RecipeConfig):
    """MADDPG or MASAC (loss.algorithm) with each agent's critic seeing the agents model.critic_visible_agents
    names; rewards per agent, returns in the logs summed over the agents."""

    env: MultiAgentEnvConfig = field(default_factory=MultiAgentEnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_B=4, batch_T=25,
                                                                               total_frames=100_000))
    """Training collector and budget (frames count env steps, each of all agents)."""
    replay: ReplayConfig = field(default_factory=lambda: ReplayConfig(size=1_000_000))
    """Replay of grouped transitions (the MADDPG paper's 1e6)."""
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=10_000))
    """Log rows and evaluations every 10k frames."""
    trainer: OffPolicyTrainerConfig = field(default_factory=OffPolicyTrainerConfig)
    """sync only (async is not wired up here yet)."""

    def validate(self) -> None:
        check_devices(self)


# --- Model ----------------------------------------------------------------------------------------------------
def visible_agents(lists: list[list[int]] | None, n_agents: int) -> list[list[int]]:
    """``model.critic_visible_agents`` checked against the env's ``n_agents`` (``ConfigError``, one line); None:
    every agent sees every agent."""
    if lists is None:
        return [list(range(n_agents)) for _ in range(n_agents)]
    if len(lists) != n_agents:
        raise ConfigError(f"model.critic_visible_agents has {len(lists)} lists; the env has {n_agents} agents, one "
                          "list each")
    for i, seen in enumerate(lists):
        if not seen or len(set(seen)) != len(seen) or max(seen) >= n_agents:
            raise ConfigError(f"model.critic_visible_agents[{i}]={seen}: name each agent at most once, at least one, "
                              f"by its index 0..{n_agents - 1}")
    return [list(seen) for seen in lists]


def group_actor(obs_spec: TensorSpec, action_spec: TensorSpec, model: ModelConfig, stochastic: bool
                ) -> TensorDictModuleBase:
    """Each agent's action from its own observation, inside the action box: a ``MultiAgentMLP`` to a tanh-squashed
    point (maddpg, TorchRL's ``TanhModule``: its ``TanhDelta`` maps 0 off the box's centre for a box other than
    [-1, 1]) or a tanh-squashed Gaussian's location and scale (masac, TorchRL's ``TanhNormal``)."""
    import torch
    from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhModule, TanhNormal

    n_agents, action_dim = action_spec.shape
    net = MultiAgentMLP(n_agent_inputs=obs_spec.shape[-1], n_agent_outputs=action_dim * (2 if stochastic else 1),
                        n_agents=n_agents, centralized=False, share_params=model.share_params,
                        num_cells=model.hidden_sizes, activation_class=torch.nn.Tanh)
    low, high = action_spec.space.low, action_spec.space.high
    if not stochastic:
        return TensorDictSequential(
            TensorDictModule(net, in_keys=[(GROUP, "observation")], out_keys=[(GROUP, "param")]),
            TanhModule(in_keys=[(GROUP, "param")], out_keys=[(GROUP, "action")], low=low, high=high))
    params = [(GROUP, "loc"), (GROUP, "scale")]
    body = TensorDictModule(torch.nn.Sequential(net, NormalParamExtractor()), in_keys=[(GROUP, "observation")],
                            out_keys=params)
    return ProbabilisticActor(body, in_keys=params, out_keys=[(GROUP, "action")], distribution_class=TanhNormal,
                              distribution_kwargs={"low": low, "high": high})


def _visible_critic_class() -> type:
    import torch
    from torchrl.modules import MLP, MultiAgentMLP

    class VisibleAgentsCritic(torch.nn.Module):
        """``Q_i`` from the observations and actions of the agents ``visible[i]`` names, in that order (lists shorter
        than the longest padded with zeros), through a ``MultiAgentMLP`` over the agents. When every agent sees the
        same agents through shared parameters, every ``Q_i`` is one function of one input: it is computed once and
        given to each agent (BenchMARL's centralised critic). A constant 0/1 matrix picks the rows each critic sees,
        not an index tensor: SACLoss vmaps its Q-networks over their stacked parameters and buffers, and an index
        buffer under vmap takes a slow path (MASAC on vmas/sampling: 21 ms an update with one, 10 ms with this)."""

        selection: torch.Tensor | None

        def __init__(self, obs_dim: int, action_dim: int, visible: list[list[int]], model: ModelConfig) -> None:
            super().__init__()
            n_agents, width = len(visible), max(len(seen) for seen in visible)
            self.one_view = model.share_critic_params and all(seen == visible[0] for seen in visible)
            views = visible[:1] if self.one_view else visible
            self.n_agents, self.n_views = n_agents, len(views)
            selection = None  # every agent in order: the rows as they are
            if views != [list(range(n_agents))]:  # row i * width + w: agent views[i][w]'s, zeros past a list's end
                selection = torch.zeros(len(views) * width, n_agents)
                for i, seen in enumerate(views):
                    selection[i * width + torch.arange(len(seen)), seen] = 1.0
            self.register_buffer("selection", selection, persistent=False)
            self.in_features = width * (obs_dim + action_dim)
            layers = dict(num_cells=model.hidden_sizes, activation_class=torch.nn.Tanh)
            self.net = MLP(in_features=self.in_features, out_features=1, **layers) if self.one_view else \
                MultiAgentMLP(n_agent_inputs=self.in_features, n_agent_outputs=1, n_agents=n_agents,
                              centralized=False, share_params=model.share_critic_params, **layers)

        def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
            rows = torch.cat([observation, action], dim=-1)  # [..., n_agents, obs + action]
            if self.selection is not None:
                rows = torch.matmul(self.selection, rows)  # [..., n_views * width, obs + action]
            q = self.net(rows.unflatten(-2, (self.n_views, -1)).flatten(-2))  # [..., n_views, 1]
            return q.expand(*q.shape[:-2], self.n_agents, 1)

    return VisibleAgentsCritic


def group_critic(obs_spec: TensorSpec, action_spec: TensorSpec, visible: list[list[int]], model: ModelConfig
                 ) -> TensorDictModuleBase:
    """``(agents, "state_action_value")`` ``[..., n_agents, 1]``: each agent's Q of what its critic sees."""
    from torchrl.modules import ValueOperator

    critic = _visible_critic_class()(obs_spec.shape[-1], action_spec.shape[-1], visible, model)
    return ValueOperator(critic, in_keys=[(GROUP, "observation"), (GROUP, "action")],
                         out_keys=[(GROUP, "state_action_value")])


def group_loss(cfg: Config, actor: TensorDictModuleBase, critic: TensorDictModuleBase, action_spec: TensorSpec
               ) -> Any:
    """TorchRL's ``DDPGLoss`` (maddpg) or ``SACLoss`` (masac) on the group's keys: each agent's own reward and
    done flags, a TD(0) target, and ``(agents, "mask")`` as the mask of every term's mean."""
    from torchrl.objectives import DDPGLoss, SACLoss, ValueEstimators

    keys = dict(state_action_value=(GROUP, "state_action_value"), reward=(GROUP, "reward"), done=(GROUP, "done"),
                terminated=(GROUP, "terminated"))
    if cfg.loss.algorithm == "maddpg":
        loss = DDPGLoss(actor, critic, loss_function="l2", delay_actor=True, delay_value=True)
    else:
        # -action_dim per agent in the [-1, 1]-rescaled action space (recipes/sac.py's), whatever the box's units
        half_width = (action_spec.space.high[0] - action_spec.space.low[0]).float() / 2
        target_entropy = cfg.loss.target_entropy
        if target_entropy is None:
            target_entropy = float(half_width.log().sum()) - half_width.numel()
        loss = SACLoss(actor, critic, num_qvalue_nets=2, loss_function="l2", delay_qvalue=True,
                       alpha_init=cfg.loss.alpha_init, fixed_alpha=cfg.loss.fixed_alpha, target_entropy=target_entropy)
        keys["action"] = (GROUP, "action")
    loss.set_keys(**keys)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=cfg.loss.gamma)
    loss.loss_mask_key = (GROUP, "mask")  # an absent agent's rows add nothing to any term
    return loss


# --- Recipe ---------------------------------------------------------------------------------------------------
def main(cfg: Config) -> dict:
    import torch
    from torchrl.modules import AdditiveGaussianModule

    from tdrl.collect import make_eval_collector
    from tdrl.envs import EnvFactory
    from tdrl.log.run import Run
    from tdrl.models import chain_policy
    from tdrl.objectives.graphs import graph_adam, update_step
    from tdrl.objectives.update import TargetUpdate, Updater
    from tdrl.replay import grouped_transition_keys
    from tdrl.wiring import (
        check_min_steps_learn,
        check_trainer,
        collector_factory_from,
        make_trainer,
        prepare_recipe,
        transition_replay_from,
    )

    check_trainer(cfg.trainer, on_policy=False, supported=("sync",))
    # --- Build ----------------------------------------------------------------------------------------------
    device, _ = prepare_recipe(cfg)
    check_min_steps_learn(cfg.optim.min_steps_learn, n_step=cfg.loss.n_step, batch_B=cfg.collector.batch_B)
    env_kwargs: dict[str, Any] = {**cfg.env.kwargs(), "group_map": "one_group",
                                  **({"continuous_actions": True} if cfg.env.continuous_actions else {})}
    env_factory = EnvFactory(cfg.env.id, env_kwargs)
    specs = env_factory.specs()  # an unknown id, a missing extra or agents with other spaces: one line, exit 2
    obs_spec, action_spec = specs.observation_spec, specs.action_spec[GROUP, "action"]
    if not action_spec.dtype.is_floating_point:
        raise ConfigError(f"env.id={cfg.env.id!r} has discrete actions; {cfg.loss.algorithm.upper()} needs "
                          "continuous ones (use recipes/qmix.py or recipes/mappo.py)")
    n_agents = action_spec.shape[0]
    visible = visible_agents(cfg.model.critic_visible_agents, n_agents)

    actor = group_actor(obs_spec[GROUP, "observation"], action_spec, cfg.model, cfg.loss.algorithm == "masac")
    critic = group_critic(obs_spec[GROUP, "observation"], action_spec, visible, cfg.model)
    loss = group_loss(cfg, actor, critic, action_spec).to(device)
    if cfg.loss.algorithm == "maddpg":  # each agent's action plus annealed noise, clipped to the box
        half_width = float((action_spec.space.high - action_spec.space.low).mean()) / 2
        noise = AdditiveGaussianModule(action_spec, sigma_init=cfg.exploration.sigma_init,
                                       sigma_end=cfg.exploration.sigma_final,
                                       annealing_num_steps=cfg.exploration.sigma_frames, std=half_width,
                                       action_key=(GROUP, "action"), device=device)
        policy = chain_policy(actor, noise).to(device)
    else:  # masac samples its actions
        noise, policy = None, chain_policy(actor).to(device)
    # one Adam, a rate per part: loss_actor reads the critics through detached parameters (and loss_alpha only
    # log_alpha), so the sum of the terms is separable
    critic_params = loss.value_network_params if cfg.loss.algorithm == "maddpg" else loss.qvalue_network_params
    actor_params = [*loss.actor_network_params.values(True, True),
                    *([loss.log_alpha] if cfg.loss.algorithm == "masac" and not cfg.loss.fixed_alpha else [])]
    optimizer = graph_adam([{"params": actor_params, "lr": cfg.optim.actor_lr},
                            {"params": list(critic_params.values(True, True)), "lr": cfg.optim.critic_lr}],
                           lr=cfg.optim.critic_lr, device=device, cudagraphs=cfg.optim.cudagraphs)
    loss_keys = ("loss_actor", "loss_qvalue", *(("loss_alpha",) if cfg.loss.algorithm == "masac" else ()))
    updater = Updater(optimizer, loss_keys=loss_keys, max_grad_norm=cfg.optim.max_grad_norm,
                      target_update=TargetUpdate(loss, interval=cfg.optim.target_update_interval,
                                                 tau=cfg.optim.target_update_tau))

    run = Run.open(cfg, name=cfg.loss.algorithm)
    # the grouped transitions, [n, n_agents] per sampled step: observations, presence, actions, rewards, flags
    replay = transition_replay_from(cfg, run.dir, device, keys=grouped_transition_keys(obs_spec))
    collector = collector_factory_from(cfg, env_factory, policy, device=device, return_same_td=True)()
    # each evaluation: eval.n_envs whole episodes of the deterministic actors (no noise, the Gaussian's mode)
    eval_collector = make_eval_collector(cfg.env.id, actor, n_envs=cfg.eval.n_envs, max_steps=cfg.eval.max_steps,
                                         seed=cfg.run.seed + 10_000, discount=cfg.loss.gamma, video=cfg.eval.video,
                                         env_kwargs=env_kwargs)
    trainer = make_trainer(cfg, on_policy=False, collector=collector, replay=replay, eval_collector=eval_collector,
                           run=run, checkpoint_state={"loss": loss, "updater": updater, "replay": replay,
                                                      "policy": policy})

    # --- Update ---------------------------------------------------------------------------------------------
    compute_loss = torch.compile(loss) if cfg.optim.compile else loss

    def learn(sample: TensorDictBase) -> TensorDictBase:  # optim.cudagraphs replays it from one CUDA graph
        terms = compute_loss(sample)
        if "loss_value" in terms.keys():
            terms.rename_key_("loss_value", "loss_qvalue")  # DDPG's critic term, named as SAC's
        return updater.apply(terms)

    learn_step = update_step(learn, cudagraphs=cfg.optim.cudagraphs, device=device)

    def update() -> TensorDictBase:
        metrics = learn_step(replay.sample(cfg.optim.batch_size))  # a batch of grouped transitions
        updater.advance()  # counters and the target networks
        return metrics

    # --- Loop -----------------------------------------------------------------------------------------------
    frames_per_batch = cfg.collector.batch_B * cfg.collector.batch_T
    for _ in trainer:  # each iteration: batch_B x batch_T new grouped transitions went into the replay
        if noise is not None:
            noise.step(frames_per_batch)  # the noise of the next batch
        metrics = [update() for _ in range(trainer.updates_due)]
        trainer.record(metrics, updates=len(metrics))
    return trainer.summary


if __name__ == "__main__":
    run_recipe(main, Config(), prog="recipes/maddpg.py", doc=__doc__)
