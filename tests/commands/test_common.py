"""provisioner.commands.common: the consoles every command prints through."""

from __future__ import annotations

import pytest

from provisioner.commands.common import consoles


def test_file_line_column_prints_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    # rich's emoji codes would turn "m.yaml:100:1" into "m.yaml💯1" (seen in validate's output)
    out, err = consoles()
    out.print("m.yaml:100:1: warning: monitoring: :smile: [bold]x[/bold]")
    err.print("m.yaml:100:1: error")
    got = capsys.readouterr()
    assert got.out == "m.yaml:100:1: warning: monitoring: :smile: x\n"
    assert got.err == "m.yaml:100:1: error\n"
