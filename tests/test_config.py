"""Config overrides: types, declared ranges, strict lists, unknown keys with suggestions, --help; every numeric
field of every recipe declares its range."""

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import pytest

from tdrl.config import (
    AnyFloat,
    CollectorConfig,
    ConfigError,
    Count,
    EnvConfig,
    EvalConfig,
    LayerSizes,
    PositiveFloat,
    PositiveFraction,
    Range,
    RecipeConfig,
    RunConfig,
    apply_overrides,
    config_help,
    diff_configs,
    merge_nested,
    parse_args,
    to_dict,
    validate,
)
from tdrl.launch.recipe import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.py"))


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


def test_every_collector_kind_is_selectable_from_a_config():
    from tdrl.collect import COLLECTOR_KINDS

    kinds = typing.get_args(typing.get_type_hints(CollectorConfig)["kind"])
    assert set(kinds) == set(COLLECTOR_KINDS)  # a kind make_collector has but no recipe can pick is dead code
    assert apply_overrides(RecipeConfig(), ["collector.kind=torchrl"]).collector.kind == "torchrl"
    cfg = apply_overrides(RecipeConfig(), ["collector.kind=alternating", "collector.n_workers=2"])
    assert cfg.collector.batch_B == 8  # two groups of two workers, two envs each
    with pytest.raises(ConfigError, match=r"collector.batch_B=6 must be divisible by 2 \* collector.n_workers=4"):
        apply_overrides(RecipeConfig(), ["collector.kind=alternating", "collector.batch_B=6"])


def test_sections_validate_after_every_override_is_in():
    from tdrl.config import RecipeConfig

    cfg = apply_overrides(RecipeConfig(), ["collector.kind=parallel", "collector.n_workers=3", "collector.batch_B=6"])
    assert cfg.collector.batch_B == 6  # n_workers=3 alone would not divide the default 8; the final config does
    with pytest.raises(ConfigError, match=r"collector.batch_B=8 must be divisible by collector.n_workers=3"):
        apply_overrides(RecipeConfig(), ["collector.kind=parallel", "collector.n_workers=3"])
    with pytest.raises(ConfigError, match=r"config key 'collector.batch_T': 0 must be >= 1"):
        merge_nested(RecipeConfig(), {"collector": {"batch_T": 0}})  # sweeps merge variants the same way
    with pytest.raises(ConfigError, match=r"eval.video=true .* needs eval.n_envs >= 1"):
        apply_overrides(RecipeConfig(), ["eval.video=true", "eval.n_envs=0"])
    with pytest.raises(ConfigError, match=r"run.device='gpu:0' is not a device"):
        apply_overrides(RecipeConfig(), ["run.device=gpu:0"])
    assert apply_overrides(RecipeConfig(), ["run.device=cuda:1"]).run.device == "cuda:1"  # syntax only here


# --- Declared ranges ----------------------------------------------------------------------------------------


@dataclass
class Ranged:
    lr: PositiveFloat = 0.0023
    """Learning rate."""
    gamma: PositiveFraction = 0.99
    """Discount."""
    hidden_sizes: LayerSizes = field(default_factory=lambda: [64, 64])
    """Widths."""
    head_sizes: list[Count] = field(default_factory=list)
    """Widths; may be empty."""
    clip: PositiveFloat | None = None
    """Clip; none disables."""
    lag: Annotated[int, Range(ge=-1)] = 0
    """-1: no limit."""
    target: AnyFloat = 0.0
    """Any number."""


@dataclass
class RangedCfg:
    optim: Ranged = field(default_factory=Ranged)


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-1", "config key 'optim.lr': -1.0 must be > 0"),
    ("optim.lr=0", "config key 'optim.lr': 0.0 must be > 0"),
    ("optim.gamma=2", "config key 'optim.gamma': 2.0 must be in (0, 1]"),
    ("optim.gamma=0", "config key 'optim.gamma': 0.0 must be in (0, 1]"),
    ("optim.hidden_sizes=[64,0]", "config key 'optim.hidden_sizes[1]': 0 must be >= 1"),
    ("optim.hidden_sizes=[64,x]", "config key 'optim.hidden_sizes[1]': expected an int, got 'x'"),
    ("optim.hidden_sizes=[]", "config key 'optim.hidden_sizes': [] must have at least 1 item"),
    ("optim.clip=-0.5", "config key 'optim.clip': -0.5 must be > 0"),
    ("optim.lag=-2", "config key 'optim.lag': -2 must be >= -1"),
    ("optim.target=nan", "config key 'optim.target': nan is not a number"),
])
def test_out_of_range_values_name_the_key_the_value_and_the_range(override, message):
    with pytest.raises(ConfigError) as info:
        apply_overrides(RangedCfg(), [override])
    assert str(info.value) == message


def test_values_in_range_and_none_for_optional_fields_are_kept():
    cfg = apply_overrides(RangedCfg(), ["optim.lr=1e-3", "optim.gamma=1", "optim.hidden_sizes=[1]", "optim.clip=none",
                                        "optim.head_sizes=[]", "optim.lag=-1", "optim.target=-1e9"])
    assert (cfg.optim.lr, cfg.optim.gamma, cfg.optim.hidden_sizes, cfg.optim.clip) == (1e-3, 1.0, [1], None)
    assert (cfg.optim.head_sizes, cfg.optim.lag, cfg.optim.target) == ([], -1, -1e9)


def test_validate_checks_defaults_and_values_set_in_code():
    @dataclass
    class BadDefault:
        lr: PositiveFloat = 0.0

    with pytest.raises(ConfigError, match=r"config key 'lr': 0.0 must be > 0"):
        apply_overrides(BadDefault(), [])  # a default cannot skip its range
    cfg = RecipeConfig()
    cfg.collector.batch_T = 0  # set in code, not through an override
    with pytest.raises(ConfigError, match=r"config key 'collector.batch_T': 0 must be >= 1"):
        validate(cfg)
    cfg = RangedCfg()
    cfg.optim.hidden_sizes = [64, -1]
    with pytest.raises(ConfigError, match=r"config key 'optim.hidden_sizes\[1\]': -1 must be >= 1"):
        validate(cfg)


@pytest.mark.parametrize("text", ["[64,", "64]", "[64,,64]", "[64,]", "[,64]", "", "[64)", "[[64]]", "[64", "(64"])
def test_lists_parse_strictly(text):
    with pytest.raises(ConfigError, match=r"config key 'optim.head_sizes': .* is not a list"):
        apply_overrides(RangedCfg(), [f"optim.head_sizes={text}"])


@pytest.mark.parametrize("text, items", [("[64, 32]", [64, 32]), ("(64,32)", [64, 32]), ("64,32", [64, 32]),
                                         ("[ 8 ]", [8]), ("8", [8]), ("[]", []), ("[ ]", [])])
def test_well_formed_lists_parse(text, items):
    assert apply_overrides(RangedCfg(), [f"optim.head_sizes={text}"]).optim.head_sizes == items


@dataclass
class Nested:
    visible: list[list[Annotated[int, Range(ge=0)]]] | None = None
    """Lists of lists (recipes/maddpg.py's model.critic_visible_agents)."""


@pytest.mark.parametrize("text, items", [("[[0,1],[1,2],[2,0]]", [[0, 1], [1, 2], [2, 0]]), ("[[0], [1]]", [[0], [1]]),
                                         ("[[0, 1]]", [[0, 1]]), ("[]", []), ("none", None)])
def test_lists_of_lists_parse(text, items):
    assert apply_overrides(Nested(), [f"visible={text}"]).visible == items


@pytest.mark.parametrize("text, message", [
    ("[[0,1],[1,2]", "is not a list; write it as [[0, 1], [1, 2]]"), ("[[0,1],2]", "is not a list"),
    ("[0,1]", "is not a list"), ("[[0,1]],", "is not a list"), ("[[0,,1]]", "config key 'visible[0]': "),
    ("[[0,-1]]", "config key 'visible[0][1]': -1 must be >= 0")])
def test_lists_of_lists_parse_strictly(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(Nested(), [f"visible={text}"])


def test_help_shows_each_fields_range():
    text = config_help(RangedCfg())
    for line in ["optim.lr (float > 0) = 0.0023  Learning rate.", "optim.gamma (float in (0, 1]) = 0.99",
                 "optim.hidden_sizes (non-empty list[int >= 1]) = [64, 64]", "optim.head_sizes (list[int >= 1]) = []",
                 "optim.clip (float > 0 or None) = None", "optim.lag (int >= -1) = 0", "optim.target (float) = 0.0"]:
        assert f"  {line}" in text


def test_a_range_has_one_bound_per_side():
    assert (str(Range(ge=0, le=1)), str(Range(gt=0)), str(Range()), repr(Range(gt=0, le=1))) == \
        ("in [0, 1]", "> 0", "", "Range(gt=0, le=1)")
    with pytest.raises(ValueError, match="one lower bound"):
        Range(gt=0, ge=1)


# --- Every recipe ---------------------------------------------------------------------------------------------


def undeclared_ranges(cls: type, prefix: str = "") -> list[str]:
    """Dotted keys of the int and float fields (and lists of them) of dataclass ``cls`` without a declared Range."""
    hints = typing.get_type_hints(cls, include_extras=True)
    missing = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            missing += undeclared_ranges(tp, f"{prefix}{f.name}.")
        elif _number_without_range(tp):
            missing.append(f"{prefix}{f.name}")
    return missing


def _number_without_range(tp) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return not any(isinstance(a, Range) for a in args[1:]) and _number_without_range(args[0])
    if origin in (typing.Union, types.UnionType, list, tuple):
        return any(_number_without_range(a) for a in args if a is not Ellipsis)
    return tp in (int, float)


def test_the_range_walk_finds_undeclared_numbers():
    @dataclass
    class Loose:
        n: int = 1
        x: float | None = None
        sizes: list[int] = field(default_factory=list)
        tuple_sizes: tuple[float, ...] = ()
        ok: Count = 1
        ok_list: LayerSizes = field(default_factory=lambda: [1])
        flag: bool = False
        name: str = ""
        optim: Optim = field(default_factory=Optim)

    assert undeclared_ranges(Loose) == ["n", "x", "sizes", "tuple_sizes", "optim.lr", "optim.hidden", "optim.clip"]


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_numeric_field_of_every_recipe_declares_its_range(path):
    config = load_recipe(path).Config
    assert undeclared_ranges(config) == []
    validate(config())  # and the defaults are in range


def test_cross_field_checks_stay_in_validate():
    dqn = load_recipe(next(p for p in RECIPES if p.stem == "dqn"))
    with pytest.raises(ConfigError, match=r"model.v_min=10.0 must be < model.v_max=10.0"):
        apply_overrides(dqn.Config(), ["model.v_min=10", "model.v_max=10"])
    with pytest.raises(ConfigError, match=r"exploration.eps_final_min=0.1 must be <= exploration.eps_final=0.01"):
        apply_overrides(dqn.Config(), ["exploration.eps_final_min=0.1", "exploration.eps_final=0.01"])


def test_env_options_parse_as_the_envs_arguments():
    from tdrl.config import ConfigError, GroupedEnvConfig

    env = GroupedEnvConfig(options=["N=5", "local_ratio=0.3", "shared_rew=false", "mode=fast", "x=none", " y = 1e3 "])
    assert env.kwargs() == {"N": 5, "local_ratio": 0.3, "shared_rew": False, "mode": "fast", "x": None, "y": 1000.0}
    for bad, message in ((["N"], "'N' is not name=value"), (["=3"], "is not name=value"),
                         (["num_envs=4"], r"num_envs is set by tdrl \(collector.batch_B\)")):
        with pytest.raises(ConfigError, match=message):
            GroupedEnvConfig(options=bad).validate()
