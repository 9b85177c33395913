"""provisioner.secretfile: an operator's secret file, read in one place with one message
shape for every area (``<field>: <path> (<what it is for>): <problem>``), never its content."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import ProvisionError
from provisioner.secretfile import private_file_text

SECRET = "s3cret-Value-77"


def write(path: Path, content: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_the_text_with_one_trailing_newline_dropped(tmp_path: Path) -> None:
    assert private_file_text(write(tmp_path / "k", f"{SECRET}\n".encode()), "f", "w") == SECRET
    assert private_file_text(write(tmp_path / "k", b"a\nb\n\n"), "f", "w") == "a\nb\n"


@pytest.mark.parametrize(("setup", "problem"), [
    ("missing", "cannot read it: No such file or directory"),
    ("folder", "not a regular file"),
    ("everyone", "readable by everyone; run chmod o-r {path}"),
    ("binary", "cannot read it: not UTF-8 text"),
    ("two lines", "must hold one non-empty line"),
    ("empty", "must hold one non-empty line"),
])
def test_every_refusal_has_one_shape_and_never_the_content(tmp_path: Path, setup: str, problem: str) -> None:
    path = tmp_path / "secret"
    if setup == "folder":
        path.mkdir()
    elif setup == "everyone":
        write(path, SECRET.encode(), 0o644)
    elif setup == "binary":
        write(path, b"\xff\xfe" + SECRET.encode())
    elif setup == "two lines":
        write(path, f"{SECRET}\nmore\n".encode())
    elif setup == "empty":
        write(path, b"\n")
    with pytest.raises(ProvisionError) as info:
        private_file_text(path, "backup.key_file", "the backup passphrase", one_line=True)
    assert str(info.value) == f"backup.key_file: {path} (the backup passphrase): {problem.format(path=path)}"
    assert SECRET not in str(info.value)
