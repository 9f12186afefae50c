"""Every `embforge --help` text is the one in tests/flows/cli_help/ (kept by hand: a change to the command line shows
here as a diff of its help), and every command has one."""

import argparse

import pytest

from flows.cli import parser
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "flows" / "cli_help"


def helps(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Each command's help, and `embforge`'s own, as printed on a terminal 100 columns wide. No help prints a default
    taken from the current folder (`--working-dir` says "this one"), so the texts are the same from any folder."""
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps at the terminal's width
    top = parser()
    [commands] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return {"embforge": top.format_help(), **{name: sp.format_help() for name, sp in commands.choices.items()}}


def test_every_command_has_its_help_text_on_file(monkeypatch):
    assert set(helps(monkeypatch)) == {path.stem for path in GOLDEN.glob("*.txt")}


def test_every_help_text_is_the_one_on_file(monkeypatch):
    changed = [name for name, text in helps(monkeypatch).items() if text != (GOLDEN / f"{name}.txt").read_text()]
    assert changed == [], "the command line changed: update tests/flows/cli_help/ if that was meant"
