"""benchmarks/benchmarl_reference.py without BenchMARL: its arguments, the mapping of tdrl's recipe defaults onto
BenchMARL's configs, the venv it would make (commands recorded, nothing installed), the summed-over-agents return
it records from BenchMARL's evaluation rollouts, and the CSV and page it writes from fake runs."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from tdrl.config import apply_overrides

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchmarl_reference as ref  # noqa: E402
import benchmarl_tasks as tasks  # noqa: E402
from report import markdown_page  # noqa: E402


def test_arguments():
    args = ref.parse_args(["--frames", "1600", "--seeds", "0,1", "--algorithms", "mappo,qmix", "--tdrl"])
    assert (args.frames, args.seeds, args.algorithms, args.tdrl) == (1600, [0, 1], ["mappo", "qmix"], True)
    assert args.runs == [("simple_spread", "mappo"), ("simple_spread", "qmix"), ("balance", "mappo"),
                         ("navigation", "mappo"), ("foraging", "qmix")]
    assert ref.parse_args([]).runs == [("simple_spread", "mappo"), ("simple_spread", "ippo"), ("simple_spread", "qmix"),
                                       ("balance", "mappo"), ("balance", "ippo"), ("navigation", "mappo"),
                                       ("navigation", "ippo"), ("sampling", "masac"), ("foraging", "ippo"),
                                       ("foraging", "qmix")]
    assert ref.parse_args(["--tasks", "sampling,balance", "--algorithms", "masac,ippo"]).runs == [
        ("sampling", "masac"), ("balance", "ippo")]
    for bad in (["--algorithms", "maddpg"], ["--tasks", "pong"], ["--no-benchmarl"],
                ["--tasks", "sampling", "--algorithms", "mappo"]):  # the issue compares only MASAC on sampling
        with pytest.raises(SystemExit):
            ref.parse_args(bad)


def test_mappo_settings_are_the_recipes_defaults():
    cfg = tasks.recipe_config("simple_spread", "mappo", 6400)
    settings = tasks.benchmarl_config("simple_spread", "mappo", cfg, 6400, 3200)
    experiment, algorithm = settings["experiment"], settings["algorithm"]
    assert (experiment["lr"], experiment["gamma"], experiment["clip_grad_val"]) == (7e-4, 0.99, 5.0)
    assert (experiment["on_policy_collected_frames_per_batch"], experiment["on_policy_n_envs_per_worker"]) == (800, 8)
    assert (experiment["on_policy_n_minibatch_iters"], experiment["on_policy_minibatch_size"]) == (4, 800)
    assert (experiment["max_n_frames"], experiment["evaluation_interval"], experiment["evaluation_episodes"]) == \
        (6400, 3200, 10)
    assert experiment["prefer_continuous_actions"] is False and experiment["render"] is False
    assert (algorithm["lmbda"], algorithm["clip_epsilon"], algorithm["entropy_coef"]) == (0.95, 0.2, 0.01)
    assert algorithm["loss_critic_type"] == "smooth_l1" and algorithm["critic_coef"] == 1.0
    assert settings["task"] == {"N": 3, "local_ratio": 0.5, "max_cycles": 25}
    assert settings["model"] == {"num_cells": [64, 64], "activation_class": "Tanh"}
    assert settings["optimizer_lr"] == {}  # one rate: BenchMARL's lr
    ippo = tasks.benchmarl_config("simple_spread", "ippo", tasks.recipe_config("simple_spread", "ippo", 6400), 6400,
                                  3200)
    assert ippo == settings  # the same recipe: only the critic (BenchMARL's algorithm class) differs
    with pytest.raises(ValueError, match="multiples of the batch"):
        tasks.benchmarl_config("simple_spread", "mappo", cfg, 6000, 3000)


def test_vmas_settings_are_tdrls_on_both_sides():
    """VMAS runs: continuous actions, tdrl's collector and 100-step limit, BenchMARL's VMAS batch as 60 envs x 100
    steps and 45 minibatches of 400."""
    from tdrl.envs.vmas import DEFAULT_MAX_STEPS

    cfg = tasks.recipe_config("balance", "ippo", 12000)
    assert (cfg.env.id, cfg.collector.kind, cfg.loss.algorithm) == ("vmas/balance", "batched_env", "ippo")
    settings = tasks.benchmarl_config("balance", "ippo", cfg, 12000, 6000)
    experiment = settings["experiment"]
    assert experiment["prefer_continuous_actions"] is True
    assert (experiment["on_policy_collected_frames_per_batch"], experiment["on_policy_n_envs_per_worker"]) == \
        (6000, 60)
    assert (experiment["on_policy_n_minibatch_iters"], experiment["on_policy_minibatch_size"]) == (3, 400)
    assert {name: t.settings["max_steps"] for name, t in tasks.TASKS.items() if t.family == "vmas"} == {
        "balance": DEFAULT_MAX_STEPS, "navigation": DEFAULT_MAX_STEPS, "sampling": DEFAULT_MAX_STEPS}
    spec = tasks.worker_spec("balance", "ippo", 2, settings)
    assert (spec["benchmarl_task"], spec["benchmarl_algorithm"], spec["seed"]) == (["VmasTask", "BALANCE"],
                                                                                  "IppoConfig", 2)
    assert json.loads(json.dumps(spec)) == spec  # it travels to the worker as JSON


@pytest.mark.parametrize("name", ["balance", "navigation", "sampling"])
def test_vmas_task_settings_are_the_scenarios_defaults(name):
    """The settings BenchMARL's task gets are what tdrl's env runs: VMAS's scenario defaults, tdrl's time limit."""
    from tdrl.envs.vmas import make_vmas

    task = tasks.TASKS[name]
    env = make_vmas(task.env_id, None, {"num_envs": 1})
    try:
        built = {key: getattr(env.vmas.scenario, key) for key in task.settings if key != "max_steps"}
        assert built == {key: value for key, value in task.settings.items() if key != "max_steps"}
        assert env.limit == task.settings["max_steps"] and len(env.vmas.agents) == task.n_agents
    finally:
        env.close()


def test_masac_settings_are_the_recipes_defaults():
    cfg = tasks.recipe_config("sampling", "masac", 2000)
    settings = tasks.benchmarl_config("sampling", "masac", cfg, 2000, 1000)
    experiment, algorithm = settings["experiment"], settings["algorithm"]
    assert (experiment["off_policy_collected_frames_per_batch"], experiment["off_policy_n_envs_per_worker"]) == \
        (200, 8)
    assert (experiment["off_policy_n_optimizer_steps"], experiment["off_policy_train_batch_size"]) == (25, 256)
    assert (experiment["gamma"], experiment["soft_target_update"], experiment["polyak_tau"]) == (0.95, True, 0.01)
    assert (experiment["off_policy_memory_size"], experiment["clip_grad_val"]) == (1_000_000, 10.0)
    assert algorithm["target_entropy"] == -2.0  # the recipe's: -action_dim per agent, the box [-1, 1]
    assert (algorithm["num_qvalue_nets"], algorithm["alpha_init"], algorithm["fixed_alpha"]) == (2, 1.0, False)
    assert settings["optimizer_lr"] == {"loss_actor": 1e-4, "loss_alpha": 1e-4, "loss_qvalue": 1e-3}
    assert settings["model"] == {"num_cells": [64, 64], "activation_class": "Tanh"}
    four_envs = apply_overrides(cfg, ["collector.batch_B=4"])  # the recipe's own: 12.5 updates per batch
    with pytest.raises(ValueError, match="no whole number"):
        tasks.benchmarl_config("sampling", "masac", four_envs, 2000, 1000)


def test_qmix_settings_are_the_recipes_defaults():
    settings = tasks.benchmarl_config("simple_spread", "qmix", tasks.recipe_config("simple_spread", "qmix", 6400),
                                      6400, 6400)
    experiment = settings["experiment"]
    assert (experiment["off_policy_collected_frames_per_batch"], experiment["off_policy_n_envs_per_worker"]) == \
        (100, 4)
    assert (experiment["off_policy_n_optimizer_steps"], experiment["off_policy_train_batch_size"]) == (4, 800)
    assert (experiment["soft_target_update"], experiment["hard_target_update_frequency"]) == (False, 200)
    assert (experiment["exploration_eps_init"], experiment["exploration_eps_end"],
            experiment["exploration_anneal_frames"]) == (1.0, 0.05, 50_000)
    assert (experiment["lr"], experiment["clip_grad_val"], experiment["off_policy_memory_size"]) == \
        (5e-4, 10.0, 125_000)
    assert settings["algorithm"] == {"mixing_embed_dim": 32, "delay_value": True, "loss_function": "l2"}
    assert settings["model"]["activation_class"] == "ReLU"


def test_differences_name_what_the_configs_cannot():
    assert any("critic input" in line for line in tasks.differences("simple_spread", "mappo"))
    assert not any("critic input" in line for line in tasks.differences("balance", "mappo"))  # no global state
    assert not any("critic input" in line for line in tasks.differences("simple_spread", "ippo"))
    assert any("advantages" in line for line in tasks.differences("navigation", "ippo"))
    assert any("learning starts" in line for line in tasks.differences("simple_spread", "qmix"))
    assert any("*terminated*" in line for line in tasks.differences("sampling", "masac"))
    assert any("4 agents" in line for line in tasks.differences("balance", "ippo"))
    assert not any("time limit" in line for line in tasks.differences("simple_spread", "mappo"))
    for name, algorithm in tasks.pairs(list(tasks.TASKS), list(tasks.ALGORITHMS)):
        assert any("sum over the agents" in line for line in tasks.differences(name, algorithm))


def test_learning_rates_are_set_per_loss():
    """MASAC's rates on BenchMARL's Adams (one config lr), by loss name; a name it has no Adam for is an error."""
    net = torch.nn.Linear(2, 2)
    optimizers = {"agents": {name: torch.optim.Adam(net.parameters(), lr=1e-3)
                             for name in ("loss_actor", "loss_qvalue", "loss_alpha")}}
    ref.set_learning_rates(optimizers, {"loss_actor": 1e-4, "loss_alpha": 2e-4})
    assert {name: opt.param_groups[0]["lr"] for name, opt in optimizers["agents"].items()} == {
        "loss_actor": 1e-4, "loss_qvalue": 1e-3, "loss_alpha": 2e-4}
    with pytest.raises(KeyError, match="loss_value"):
        ref.set_learning_rates(optimizers, {"loss_value": 1e-4})


def test_venv_is_made_once_with_torch_held(tmp_path):
    calls = []

    def run(cmd, check, env=None):
        calls.append((cmd, Path(env["PIP_CONSTRAINT"]).read_text() if env else None))
        if cmd[1:3] == ["-m", "venv"]:
            ref.venv_python(Path(cmd[3])).parent.mkdir(parents=True, exist_ok=True)
            ref.venv_python(Path(cmd[3])).touch()

    venv = tmp_path / "venv"
    assert ref.ensure_venv(venv, run=run) == ref.venv_python(venv)
    assert [c[0][-1] for c in calls] == [str(venv), "torch==2.13.0+cpu", "lbforaging==2.0.0"]
    assert "benchmarl==1.5.2" in calls[2][0] and calls[2][1] == "torch==2.13.0\n" and calls[1][1] is None
    assert json.loads((venv / ref.MARKER).read_text())["torch"] == "2.13.0+cpu"
    calls.clear()
    ref.ensure_venv(venv, run=run)
    assert calls == []  # reused
    ref.ensure_venv(venv, torch="2.14.1+cpu", run=run)
    assert (calls[1][0][-1], calls[2][1]) == ("torch==2.14.1+cpu", "torch==2.14.1\n")  # another pin: refilled


def test_evaluations_are_recorded_summed_over_agents():
    """BenchMARL's evaluation hook: the sum over time and the 3 agents, beside BenchMARL's own per-agent mean."""
    reward = torch.full((25, 3, 1), -1.0)
    reward[:, 0] = -2.0  # one agent's return -50, the others' -25: summed -100, per-agent mean -33.3
    rollouts = [TensorDict({("next", "agent", "reward"): reward}, [25])] * 2
    logged = []
    experiment = SimpleNamespace(group_map={"agent": ["agent_0", "agent_1", "agent_2"]},
                                 logger=SimpleNamespace(log_evaluation=lambda *a, **k: logged.append(k)))
    experiment.run = lambda: experiment._evaluation_loop()
    experiment._evaluation_loop = lambda: experiment.logger.log_evaluation(rollouts, total_frames=800, step=0)
    curve = ref._record_evaluations(experiment, started=0.0)
    experiment.run()
    assert len(curve) == 1 and logged[0]["total_frames"] == 800  # BenchMARL's own logging still ran
    assert curve[0]["frames"] == 800 and curve[0]["return_mean"] == pytest.approx(-100.0)
    assert curve[0]["benchmarl_return"] == pytest.approx(-100.0 / 3)
    assert curve[0]["train_s"] >= 0 and curve[0]["wall_s"] > curve[0]["train_s"]


def _fake_rows():
    curve = [{"frames": 800, "train_s": 1.5, "wall_s": 2.0, "return_mean": -110.0, "benchmarl_return": -36.7},
             {"frames": 1600, "train_s": 3.0, "wall_s": 4.0, "return_mean": -90.0, "benchmarl_return": -30.0}]
    tdrl = [{"frames": 0, "train_s": 0.0, "wall_s": float("nan"), "return_mean": -96.0},
            {"frames": 1600, "train_s": 1.0, "wall_s": 2.5, "return_mean": -80.0}]
    return [ref.row("simple_spread-mappo", "benchmarl", 0, {"curve": curve, "wall_s": 5.0}),
            ref.row("simple_spread-mappo", "tdrl", 0, {"curve": tdrl, "wall_s": 2.5})]


def _three_seeds():
    """balance-mappo on 3 seeds each side: finals tdrl -10, -20, -60 (train 10, 20, 30 s), BenchMARL -30, -40, -50."""
    def run(final, train):
        return {"curve": [{"frames": 8000, "train_s": train, "wall_s": train + 5, "return_mean": final}],
                "wall_s": train + 5}

    return [*(ref.row("balance-mappo", "tdrl", s, run(f, t)) for s, (f, t) in enumerate([(-10, 10), (-20, 20),
                                                                                          (-60, 30)])),
            *(ref.row("balance-mappo", "benchmarl", s, run(f, 40.0)) for s, f in enumerate([-30, -40, -50]))]


def test_csv_has_the_learning_benchmarks_columns(tmp_path):
    import learning

    path = tmp_path / "data" / "marl.csv"
    ref.write_csv(_fake_rows(), path)
    with path.open() as f:
        lines = list(csv.DictReader(f))
    assert ref.COLUMNS[:len(learning.SWEEP_COLUMNS)] == learning.SWEEP_COLUMNS
    assert [(r["impl"], r["CumSteps"], r["eval/return_mean"]) for r in lines] == [
        ("benchmarl", "800", "-110.0"), ("benchmarl", "1600", "-90.0"), ("tdrl", "0", "-96.0"),
        ("tdrl", "1600", "-80.0")]
    assert lines[0]["task"] == "simple_spread-mappo" and lines[-1]["time/wall_s"] == "2.5"


def test_summary_puts_both_sides_iqm_and_seconds_side_by_side(capsys):
    """Per task and algorithm one line: tdrl's and BenchMARL's IQM [95% CI] (tdrl.plot's), frames, mean seconds."""
    import numpy as np

    from tdrl.plot import iqm_with_ci

    ref.summarise(_three_seeds() + _fake_rows())
    out = capsys.readouterr().out.splitlines()
    center, low, high = iqm_with_ci(np.array([[-10.0], [-20.0], [-60.0]]))
    assert (center[0], low[0], high[0]) == (-30.0, -60.0, -10.0)  # 3 seeds: the IQM is their mean
    balance = next(line for line in out if line.startswith("balance-mappo"))
    assert balance.split() == ["balance-mappo", "3", "/", "3", "-30.0", "[-60.0,", "-10.0]", "-40.0", "[-50.0,",
                               "-30.0]", "8,000", "20.0", "40.0", "25.0", "45.0"]
    spread = next(line for line in out if line.startswith("simple_spread-mappo"))
    assert spread.split() == ["simple_spread-mappo", "1", "/", "1", "-80.0", "(one", "seed)", "-90.0", "(one",
                              "seed)", "1,600", "1.0", "3.0", "2.5", "5.0"]
    ref.summarise(_three_seeds()[:3])  # tdrl's side only (--no-benchmarl)
    only = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("balance-mappo"))
    assert only.split()[1:4] == ["3", "/", "0"] and only.split()[-4:] == ["20.0", "-", "25.0", "-"]


def test_page_section_holds_the_rows(tmp_path, capsys):
    page = tmp_path / "learning.md"
    page.write_text("# Learning\n\n## Multi-agent\n\nBenchMARL beside tdrl.\n\n## Other\n\nkept\n")
    with markdown_page("Multi-agent", ["benchmarks/benchmarl_reference.py", "--markdown", f"{page}#multi-agent"]):
        for r in _fake_rows():
            ref.print_row(r)
        ref.summarise(_fake_rows())
    text = page.read_text()
    assert "BenchMARL beside tdrl.\n\n<!-- results:multi-agent -->" in text and text.endswith("## Other\n\nkept\n")
    assert ("final    -90.0 (BenchMARL logs -30.0 per agent) at 1,600 frames; train 3.0 s (533 frames/s), "
            "wall 5.0 s") in text
    assert "-80.0 (one seed)" in text and "-80.0 (one seed)" in capsys.readouterr().out


def test_jobs_pair_the_sides_of_each_seed(tmp_path):
    """BenchMARL's run of a seed, then tdrl's (``--jobs 2`` runs them side by side), each in its own folder of
    ``--results`` and its own subprocess (tdrl's through ``--tdrl-worker``)."""
    args = ref.parse_args(["--tasks", "balance", "--algorithms", "mappo", "--frames", "12000", "--seeds", "0,1",
                           "--tdrl", "--results", str(tmp_path), "--jobs", "2"])
    todo = ref.jobs(args, Path("/venv/bin/python"), tmp_path)
    assert [(j.side, j.seed) for j in todo] == [("benchmarl", 0), ("tdrl", 0), ("benchmarl", 1), ("tdrl", 1)]
    assert todo[0].command[:3] == ("/venv/bin/python", ref.__file__, "--worker")
    assert todo[1].command[1:3] == (ref.__file__, "--tdrl-worker")
    specs = [json.loads(j.command[-1]) for j in todo]
    assert specs[0]["run_dir"] == str(tmp_path / "balance-mappo" / "benchmarl-seed0" / "run")
    assert specs[1]["run_dir"] == str(tmp_path / "balance-mappo" / "tdrl-seed0" / "run")
    assert (specs[1]["frames"], specs[1]["eval_interval"], specs[0]["family"]) == (12000, 12000, "vmas")


def test_a_finished_run_is_kept_and_not_run_again(tmp_path):
    """run_job keeps the worker's result in the run's folder; the same job later reads it back without running."""
    result = {"curve": [{"frames": 800, "train_s": 1.0, "wall_s": 2.0, "return_mean": 5.0}], "wall_s": 2.5}
    code = f"import sys; print('noise'); print({ref.RESULT!r} + {json.dumps(json.dumps(result))}); " \
           "print('log line', file=sys.stderr)"
    job = ref.Job("balance", "mappo", "tdrl", 0, (sys.executable, "-c", code))
    first = ref.run_job(job, tmp_path)
    assert (first["final_return"], first["wall_s"], first["resumed"]) == (5.0, 2.5, False)
    assert (job.folder(tmp_path) / "log.txt").read_text() == "log line\n"
    failing = ref.Job("balance", "mappo", "tdrl", 0, (sys.executable, "-c", "raise SystemExit(3)"))
    assert ref.run_job(failing, tmp_path) == first  # kept: the command does not run
    with pytest.raises(RuntimeError, match="exit 3"):
        ref.run_job(failing, None)


def test_restore_point_skips_a_truncated_checkpoint(tmp_path):
    """A BenchMARL run resumes from its newest readable checkpoint with the curve up to it; a checkpoint a kill
    left half-written is deleted."""
    checkpoints = tmp_path / "mappo_balance_mlp__x" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for frames in (1600, 3200):
        torch.save({"frames": frames}, checkpoints / f"checkpoint_{frames}.pt")
    (checkpoints / "checkpoint_4800.pt").write_bytes(b"PK\x03")  # killed while writing
    curve = [{"frames": f, "train_s": f / 100, "wall_s": f / 80, "return_mean": 0.0} for f in (1600, 3200, 4800)]
    (tmp_path / ref.CURVE).write_text(json.dumps(curve))
    checkpoint, kept = ref._restore_point(tmp_path, torch.load)
    assert checkpoint == checkpoints / "checkpoint_3200.pt" and kept == curve[:2]
    assert not (checkpoints / "checkpoint_4800.pt").exists()
    assert ref._restore_point(tmp_path / "new", torch.load) == (None, [])


def test_resumed_evaluations_count_on_from_the_restored_seconds():
    rollouts = [TensorDict({("next", "agent", "reward"): torch.ones(10, 2, 1)}, [10])]
    experiment = SimpleNamespace(group_map={"agent": ["agent_0", "agent_1"]},
                                 logger=SimpleNamespace(log_evaluation=lambda *a, **k: None))
    experiment.run = lambda: experiment._evaluation_loop()
    experiment._evaluation_loop = lambda: experiment.logger.log_evaluation(rollouts, total_frames=2400, step=0)
    earlier = [{"frames": 1600, "train_s": 100.0, "wall_s": 150.0, "return_mean": 1.0, "benchmarl_return": 0.5}]
    curve = ref._record_evaluations(experiment, started=0.0, earlier=earlier)
    experiment.run()
    assert curve[0] == earlier[0] and curve[1]["frames"] == 2400 and curve[1]["return_mean"] == 20.0
    assert curve[1]["train_s"] >= 100.0 and curve[1]["wall_s"] > 150.0


def test_foraging_is_lbforaging_on_both_sides():
    """LBF 8x8-2p-2f-coop: 2 agents; BenchMARL's side gets benchmarks/benchmarl_lbf.py's task (it has none)."""
    task = tasks.TASKS["foraging"]
    assert (task.family, task.n_agents, task.benchmarl) == ("lbf", 2, ("LbfTask", "FORAGING"))
    assert task.env_id == "lbforaging/" + task.settings["env_id"]
    assert any("*terminated*" in line for line in tasks.differences("foraging", "qmix"))
    assert ref.ENV_LIBRARY["lbf"] == {"tdrl": "lbforaging", "benchmarl": "lbforaging"}


def test_kept_runs_plot_both_sides(tmp_path):
    """Runs in --results become runs ``tdrl plot`` draws: one curve group per side, seeds pooled."""
    from tdrl.plot import find_runs, group_runs

    for side in ref.SIDES:
        for seed in (0, 1):
            job = ref.Job("balance", "mappo", side, seed, (sys.executable, "-c", "raise SystemExit(1)"))
            curve = [{"frames": f, "train_s": f / 1000, "wall_s": f / 900, "return_mean": f / 100 + seed}
                     for f in (6000, 12000)]
            (job.folder(tmp_path) / "run").mkdir(parents=True)
            (job.folder(tmp_path) / "result.json").write_text(json.dumps(ref.row(job.name, side, seed,
                                                                                 {"curve": curve, "wall_s": 15.0})))
            if side == "tdrl":  # tdrl's recipe writes its own progress.csv
                (job.folder(tmp_path) / "run" / "progress.csv").write_text(
                    "CumSteps,eval/return_mean\n0,-5.0\n6000,60.0\n12000,120.0\n")
            assert ref.run_job(job, tmp_path)["final_return"] == 120 + seed  # kept: the failing command never runs
    groups = group_runs(find_runs([tmp_path / "balance-mappo"]))
    assert sorted((g.label, len(g.runs)) for g in groups) == [("impl=benchmarl", 2), ("impl=tdrl", 2)]
    ref.plot_curves(tmp_path, ["balance-mappo"], tmp_path / "out")
    assert (tmp_path / "out" / "marl-balance-mappo.png").stat().st_size > 1000
    for alone in (["--plot", str(tmp_path)], ["--kept-only"]):  # both read kept runs only
        with pytest.raises(SystemExit):
            ref.parse_args(alone)
