"""The installed `specheads` command: every subcommand reaches its program (its --help), `train` picks the trainer
a config is for, `tree` the tool for the heads' kind, and an unknown command is a usage error."""

import tomllib
from pathlib import Path

import pytest

from specheads.scripts import cli

REPO = Path(__file__).resolve().parent.parent


def test_pyproject_installs_the_command():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"specheads": "specheads.scripts.cli:main"}


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_shows_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: specheads {command} ")


@pytest.mark.parametrize("config, trainer", [("configs/vicuna7b.yaml", "medusa"), ("configs/smollm2-135m-medusa2.yaml", "medusa"),
                                             ("configs/smollm2-135m-eagle3.yaml", "eagle"),
                                             ("configs/smollm2-135m-eagle3-recipe.yaml", "eagle"),
                                             ("configs/smollm2-135m-dflash.yaml", "dflash")])
def test_train_picks_the_trainer_the_config_is_for(config, trainer):
    assert cli.trainer_for(["--config", config, "train.lr=1e-4"]) == (cli.TRAINERS[trainer],
                                                                       ["--config", config, "train.lr=1e-4"])
    assert cli.trainer_for(["eagle", "--config", config]) == (cli.TRAINERS["eagle"], ["--config", config])


def test_tree_picks_the_tool_for_the_heads():
    assert cli.tree_tool_for(["--heads", "heads/trained/smollm2-135m-eagle3"]).endswith("eagle_tree")
    assert cli.tree_tool_for(["--heads", "heads/trained/smollm2-135m-medusa1"]).endswith("medusa_tree")


def test_usage_and_unknown_command(capsys):
    assert cli.main([]) == 0
    shown = capsys.readouterr().out
    assert all(f"  {name} " in shown for name in cli.COMMANDS)
    assert cli.main(["trian"]) == 2 and "unknown command 'trian'" in capsys.readouterr().err
