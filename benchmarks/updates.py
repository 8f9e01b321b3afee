"""Gradient updates per second on the CPU: the no-sync update path against the old one, and optim.compile on/off.

Each row builds a recipe's learner with its defaults and times its whole update (``replay.sample``, loss, updater
steps, target update) on a replay filled with random-policy transitions:

* ``dqn``: recipes/dqn.py -- CartPole-v1, double + dueling [256, 256], 3-step returns, batch 64, fused Adam;
* ``sac``: recipes/sac.py -- Pendulum-v1, [256, 256] actor and twin critics, batch 256, two fused Adams.

Paths: ``old`` is ``Updater.step`` as it was before the no-sync change (commit 3e2634d: it read
``torch.isfinite(total + norm)`` back to the host every update), kept here only for this comparison; ``new`` is the
recipes' ``learn`` (``Updater.apply``: a NaN/inf update is skipped on the device) then ``Updater.advance``;
``new+compile`` adds ``optim.compile=true`` (``torch.compile`` of the loss, compiled before timing).

The rows of a recipe run interleaved, ``--repeats`` rounds of ``--updates`` updates each. The table gives each row's
median and best round (updates/s), its best round over ``old``'s best, and the median over rounds of its ratio to
``old`` in the same round. On a shared machine other processes only ever slow a round down, so the best rounds are
the steadier comparison; compare ratios within one invocation. Run from a temporary directory::

    cd $(mktemp -d) && python /path/to/benchmarks/updates.py [--quick] [--repeats 9] [--updates 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict

from tdrl.collect import make_collector
from tdrl.envs import EnvFactory
from tdrl.objectives.update import Updater

REPLAY_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
               ("next", "terminated"), ("next", "truncated")]


class OldUpdater(Updater):
    """``Updater.step`` before the no-sync change, line for line (its NaN error path aside): one host read of
    ``torch.isfinite(total + norm)`` per update."""

    def step(self, losses):
        keys = self.loss_keys or tuple(k for k in losses.keys() if isinstance(k, str) and k.startswith("loss_"))
        terms = [losses[k] for k in keys]
        total = terms[0].sum() if terms[0].numel() > 1 else terms[0].reshape(())
        for term in terms[1:]:
            total = total + (term.sum() if term.numel() > 1 else term.reshape(()))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p in [p for group in self.optimizer.param_groups for p in group["params"]]:
            p.grad = None
        total.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if not torch.isfinite(total + norm):
            raise FloatingPointError("non-finite loss")
        out = losses.detach() if hasattr(losses, "detach") else TensorDict({k: v.detach() for k, v in losses.items()})
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, norm)
        out.set("grad_norm", norm.detach())
        self.optimizer.step()
        if self.target_update is not None:
            self.target_update.step()
        out.set("lr", torch.tensor(float(self.optimizer.param_groups[0]["lr"])))
        self.updates += 1
        return out


def filled_replay(directory: str, env_id: str, n_step: int, frames: int):
    from tdrl.replay import TransitionReplayBuffer

    replay = TransitionReplayBuffer(directory, 100_000, n_step=n_step, gamma=0.99, keys=REPLAY_KEYS, seed=0)
    with make_collector("serial", EnvFactory(env_id), None, batch_B=1, batch_T=frames, seed=0) as collector:
        replay.extend(collector.collect())
    return replay


def dqn_update(path: str, replay) -> Callable[[], object]:
    """recipes/dqn.py's update with its default learner."""
    from tdrl.models import make_q_actor
    from tdrl.objectives.dqn import make_dqn_loss
    from tdrl.objectives.update import TargetUpdate

    torch.manual_seed(0)
    specs = EnvFactory("CartPole-v1").specs()
    q_actor = make_q_actor(specs, hidden_sizes=[256, 256], dueling=True, v_min=0.0, v_max=100.0)
    loss = make_dqn_loss(q_actor, gamma=0.99, double_dqn=True, loss_function="huber")
    updater_type = OldUpdater if path == "old" else Updater
    updater = updater_type(torch.optim.Adam(q_actor.parameters(), lr=2.3e-3, eps=0.01 / 64, fused=True),
                           max_grad_norm=10.0, target_update=TargetUpdate(loss, interval=128))
    compute_loss = torch.compile(loss) if path.endswith("compile") else loss
    if path == "old":
        return lambda: updater.step(compute_loss(replay.sample(64)).rename_key_("loss", "loss_q"))

    def update():
        metrics = updater.apply(compute_loss(replay.sample(64)).rename_key_("loss", "loss_q"))
        updater.advance()
        return metrics
    return update


def sac_update(path: str, replay) -> Callable[[], object]:
    """recipes/sac.py's update with its default learner."""
    from tdrl.models.q import make_tanh_gaussian_actor, make_twin_q
    from tdrl.objectives.sac import TwinQSACLoss
    from tdrl.objectives.update import TargetUpdate

    torch.manual_seed(0)
    specs = EnvFactory("Pendulum-v1").specs()
    actor = make_tanh_gaussian_actor(specs, hidden_sizes=[256, 256])
    critic = make_twin_q(specs, hidden_sizes=[256, 256])
    half_width = (specs.action_spec.space.high - specs.action_spec.space.low).float() / 2
    loss = TwinQSACLoss(actor, critic, gamma=0.99, alpha_init=1.0, fixed_alpha=False,
                        target_entropy=float(half_width.log().sum()) - half_width.numel())
    updater_type = OldUpdater if path == "old" else Updater
    critic_updater = updater_type(torch.optim.Adam(list(critic.parameters()), lr=1e-3, fused=True),
                                  loss_keys=("loss_qvalue",))
    policy_updater = updater_type(torch.optim.Adam([*actor.parameters(), loss.log_alpha], lr=1e-3, fused=True),
                                  loss_keys=("loss_actor", "loss_alpha"),
                                  target_update=TargetUpdate(loss, interval=1, tau=0.005))
    critic_loss, actor_loss = loss.critic_loss, loss.actor_loss
    if path.endswith("compile"):
        critic_loss, actor_loss = torch.compile(critic_loss), torch.compile(actor_loss)
    if path == "old":
        def old_update():
            sample = replay.sample(256)
            critic_updater.step(critic_loss(sample))
            return policy_updater.step(actor_loss(sample))
        return old_update

    def update():
        sample = replay.sample(256)
        critic_updater.apply(critic_loss(sample))
        metrics = policy_updater.apply(actor_loss(sample))
        critic_updater.advance()
        policy_updater.advance()
        return metrics
    return update


RECIPES = {"dqn": (dqn_update, "CartPole-v1", 3), "sac": (sac_update, "Pendulum-v1", 1)}


def measure(name: str, paths: list[str], repeats: int, updates: int, root: str) -> list[dict]:
    build, env_id, n_step = RECIPES[name]
    replay = filled_replay(os.path.join(root, name), env_id, n_step, frames=5_000)
    steps = {path: build(path, replay) for path in paths}
    for path, step in steps.items():  # warm up (compiles the compiled rows)
        start = time.perf_counter()
        for _ in range(max(updates // 4, 20)):
            step()
        print(f"  {name} {path}: warm-up {time.perf_counter() - start:.1f} s", flush=True)
    rates: dict[str, list[float]] = {path: [] for path in paths}
    for _ in range(repeats):
        for path, step in steps.items():
            start = time.perf_counter()
            for _ in range(updates):
                step()
            rates[path].append(updates / (time.perf_counter() - start))
    return [{"recipe": name, "path": path, "median": statistics.median(rates[path]), "best": max(rates[path]),
             "x_old_best": max(rates[path]) / max(rates["old"]),
             "x_old_median": statistics.median(r / o for r, o in zip(rates[path], rates["old"], strict=True))}
            for path in paths]


def main() -> None:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 50 updates, no compiled rows")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds per recipe")
    parser.add_argument("--updates", type=int, default=200, help="updates per row and round")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (recipes use 2; on a shared machine 2 threads wait on each other)")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    add_markdown_option(parser)
    args = parser.parse_args()
    repeats, updates = (3, 50) if args.quick else (args.repeats, args.updates)
    paths = ["old", "new"] if args.quick else ["old", "new", "new+compile"]
    torch.set_num_threads(args.threads)
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}, "
          f"{args.threads} threads")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tdrl-bench-updates-") as root:
        for name in args.recipes:
            rows += measure(name, paths, repeats, updates, root)
    print(f"\nupdates/s on the CPU ({repeats} interleaved rounds of {updates} updates; "
          f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    print(f"{'recipe':<6} {'path':<12} {'median/s':>9} {'best/s':>8} {'x old (best)':>13} {'x old (median)':>15}")
    for r in rows:
        print(f"{r['recipe']:<6} {r['path']:<12} {r['median']:>9.1f} {r['best']:>8.1f} {r['x_old_best']:>12.3f}x "
              f"{r['x_old_median']:>14.3f}x")


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Updates"):  # --markdown PAGE#SECTION: into its docs section
        main()
