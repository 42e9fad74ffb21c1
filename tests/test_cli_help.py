"""The command line explains itself: every option has a help text, and what the demos tell
you to run next is the command that does it."""

import argparse
import shlex
from io import StringIO

import pytest

from incr import cli


def _subparsers():
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("name", ["demo", "inspect", "graph", "ui", "gc"])
def test_every_option_has_a_help_text(name, capsys):
    p = _subparsers()[name]
    for action in p._actions:
        assert action.help, f"incr {name}: {action.option_strings or action.dest} has no help"
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in p._actions:          # each help text is shown by `incr <name> --help`
        assert " ".join(action.help.split())[:40] in text, (name, action.dest, text)

def test_sheet_demo_says_to_run_the_sheet_demo_again(tmp_path):
    store = str(tmp_path / "s")
    buf = StringIO()
    cli.demo(store=store, out=buf)
    text = buf.getvalue()
    assert f"Run `incr demo --sheet --store {shlex.quote(store)}` again" in text
    assert "Run `incr demo` again" not in text
