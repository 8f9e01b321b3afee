"""Config overrides: types, unknown keys with suggestions, --help."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from tdrl.config import (
    CollectorConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    RunConfig,
    apply_overrides,
    config_help,
    diff_configs,
    merge_nested,
    parse_args,
    to_dict,
)


@dataclass
class Optim:
    lr: float = 3e-4
    """Learning rate."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden sizes."""
    kind: Literal["adam", "sgd"] = "adam"
    """Optimizer."""
    clip: float | None = None
    """Gradient clip; none disables."""


@dataclass
class Cfg:
    run: RunConfig = field(default_factory=RunConfig)
    optim: Optim = field(default_factory=Optim)


def test_overrides_are_typed():
    cfg = apply_overrides(Cfg(), ["optim.lr=1e-3", "optim.hidden=[32,16]", "run.seed=1e3", "optim.clip=0.5"])
    assert cfg.optim.lr == 1e-3 and cfg.optim.hidden == (32, 16) and cfg.run.seed == 1000
    assert cfg.optim.clip == 0.5
    assert apply_overrides(cfg, ["optim.clip=none"]).optim.clip is None
    assert Cfg().optim.lr == 3e-4  # the original is untouched


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr'; did you mean 'optim.lr'"),
        ("lrr=1", "did you mean 'optim.lr'"),
        ("run.seed=abc", "config key 'run.seed': expected an int"),
        ("optim.kind=rmsprop", "config key 'optim.kind': 'rmsprop' is not one of"),
        ("run.force=maybe", "config key 'run.force': expected a bool"),
        ("optim=3", "is a section"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        apply_overrides(Cfg(), [override])


def test_strict_nested_merge_and_diff():
    cfg = merge_nested(Cfg(), {"optim": {"lr": 0.1}, "run": {"seed": 2}})
    assert cfg.optim.lr == 0.1 and cfg.run.seed == 2
    with pytest.raises(ConfigError, match="optim.momentum"):
        merge_nested(Cfg(), {"optim": {"momentum": 0.9}})
    assert diff_configs(to_dict(Cfg()), to_dict(cfg)) == {"optim.lr": (3e-4, 0.1), "run.seed": (0, 2)}


def test_help_lists_every_key_with_doc(capsys):
    text = config_help(Cfg())
    for key in ["run.root", "run.dir", "run.seed", "optim.lr", "optim.hidden", "optim.kind"]:
        assert key in text
    assert "Learning rate." in text
    with pytest.raises(SystemExit) as exit_info:
        parse_args(Cfg(), ["--help"])
    assert exit_info.value.code == 0
    assert "optim.clip" in capsys.readouterr().out


def test_parse_args_exits_2_on_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(Cfg(), ["optim.lrr=1"])
    assert exit_info.value.code == 2
    assert "did you mean 'optim.lr'" in capsys.readouterr().err


@dataclass
class RecipeLike:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="Pendulum-v1"))
    collector: CollectorConfig = field(default_factory=lambda: CollectorConfig(batch_B=1, batch_T=1))
    eval: EvalConfig = field(default_factory=EvalConfig)


def test_shared_sections_keep_recipe_defaults_and_strict_overrides():
    cfg = apply_overrides(RecipeLike(), ["collector.batch_T=4", "eval.n_envs=0"])
    assert (cfg.env.id, cfg.collector.batch_B, cfg.collector.batch_T, cfg.eval.n_envs) == ("Pendulum-v1", 1, 4, 0)
    assert RecipeLike().collector.total_frames == CollectorConfig().total_frames  # untouched fields keep theirs
    with pytest.raises(ConfigError, match="did you mean 'collector.batch_B'"):
        apply_overrides(RecipeLike(), ["collector.batch_b=2"])
    with pytest.raises(ConfigError, match="collector.kind"):
        apply_overrides(RecipeLike(), ["collector.kind=threads"])
    with pytest.raises(ConfigError, match="eval.n_envs"):
        apply_overrides(RecipeLike(), ["eval.n_envs=two"])


def test_sections_validate_after_every_override_is_in():
    from tdrl.config import RecipeConfig

    cfg = apply_overrides(RecipeConfig(), ["collector.kind=parallel", "collector.n_workers=3", "collector.batch_B=6"])
    assert cfg.collector.batch_B == 6  # n_workers=3 alone would not divide the default 8; the final config does
    with pytest.raises(ConfigError, match=r"collector.batch_B=8 must be divisible by collector.n_workers=3"):
        apply_overrides(RecipeConfig(), ["collector.kind=parallel", "collector.n_workers=3"])
    with pytest.raises(ConfigError, match=r"collector.batch_T=0 must be >= 1"):
        merge_nested(RecipeConfig(), {"collector": {"batch_T": 0}})  # sweeps merge variants the same way
    with pytest.raises(ConfigError, match=r"eval.video=true .* needs eval.n_envs >= 1"):
        apply_overrides(RecipeConfig(), ["eval.video=true", "eval.n_envs=0"])
    with pytest.raises(ConfigError, match=r"run.device='gpu:0' is not a device"):
        apply_overrides(RecipeConfig(), ["run.device=gpu:0"])
    assert apply_overrides(RecipeConfig(), ["run.device=cuda:1"]).run.device == "cuda:1"  # syntax only here
