"""The command line as a new user first meets it: ``--version``, ``--help`` of every command."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version

import pytest

import interp_seal
from interp_seal.cli import build_parser, main
from interp_seal.cli.common import sub_parsers

COMMANDS = {" ".join(path): parser for path, parser in sub_parsers(build_parser())}


def test_version_names_the_package_and_its_engines(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    expected = (
        f"interp-seal {interp_seal.__version__} "
        f"(torch {version('torch')}, transformers {version('transformers')})"
    )
    assert capsys.readouterr().out.strip() == expected
    assert interp_seal.__version__ == version("interp-seal")  # one source: pyproject reads it


def test_every_option_has_help_text():
    missing = [
        f"{name or 'interp-seal'} {'/'.join(action.option_strings) or action.dest}"
        for name, parser in COMMANDS.items()
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert missing == []
    assert len(COMMANDS) > 30  # every group and its sub-commands were walked


@pytest.mark.parametrize("name", ["analysis head-sweep", "tasks generate", "tune seal-h"])
def test_help_shows_defaults(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one option a line: no wrapped words
    with pytest.raises(SystemExit):
        main([*name.split(), "--help"])
    text = capsys.readouterr().out
    parser = COMMANDS[name]
    shown = [
        action
        for action in parser._actions
        if action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ]
    assert shown, f"{name} has no option with a default"
    for action in shown:
        assert f"(default: {action.default})" in text, action.option_strings


def test_every_command_prints_its_help():
    for name, parser in COMMANDS.items():
        assert parser.format_help().startswith("usage: interp-seal"), name


def test_figures_list_needs_no_out():
    run = subprocess.run(
        [sys.executable, "-m", "interp_seal.cli", "figures", "--list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    names = [line.split()[0] for line in run.stdout.splitlines()]
    from interp_seal.figures import FIGURES

    assert names == [spec.name for spec in FIGURES]


def test_figures_without_out_is_a_one_line_error(capsys):
    assert main(["figures"]) == 2
    assert capsys.readouterr().err.strip() == (
        "interp-seal figures: error: --out is required: the gallery directory to write "
        "(or --list the figures)"
    )


def test_the_parser_loads_no_torch():
    """``--help`` and ``--version`` build the whole parser: with no torch, transformers or
    pandas imported it answers in a fraction of a second (was 5.5 s), measured in the note."""
    import subprocess
    import sys

    code = (
        "import sys; from interp_seal.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
