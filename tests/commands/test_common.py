"""provisioner.commands.common: the consoles every command prints through."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from provisioner.cli import main
from provisioner.commands.common import MAX_DIAGNOSTICS, consoles, print_diagnostics
from provisioner.errors import Diagnostic


def test_file_line_column_prints_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    # rich's emoji codes would turn "m.yaml:100:1" into "m.yaml💯1" (seen in validate's output)
    out, err = consoles()
    out.print("m.yaml:100:1: warning: monitoring: :smile: [bold]x[/bold]")
    err.print("m.yaml:100:1: error")
    got = capsys.readouterr()
    assert got.out == "m.yaml:100:1: warning: monitoring: :smile: x\n"
    assert got.err == "m.yaml:100:1: error\n"


def test_repeated_diagnostics_are_capped_with_a_count(capsys: pytest.CaptureFixture[str]) -> None:
    """20,000 errors printed 40,000 lines (issue 27 item 15)."""
    _, err = consoles()
    errors = [Diagnostic("m.yaml", i, 1, f"nodes[{i}].x", "unknown field") for i in range(1, 20_001)]
    warnings = [Diagnostic("m.yaml", i, 1, "", "odd", "warning") for i in range(1, 4)]
    print_diagnostics(err, errors + warnings, most=100)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 100 + 3 + 1
    assert lines[0] == "m.yaml:1:1: nodes[1].x: unknown field"
    assert lines[99] == "m.yaml:100:1: nodes[100].x: unknown field"
    assert lines[-1] == "... and 19,900 more errors"


def test_validate_of_many_errors_prints_a_bounded_number_of_lines(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "nodes": [{"name": f"n{i}", "bogus": 1} for i in range(400)]}))
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == MAX_DIAGNOSTICS + 1 and lines[-1].startswith("... and ") and lines[-1].endswith(" more errors")
