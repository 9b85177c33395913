"""BMC passwords from password_env / password_file: found, refused, never shown."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from provisioner.bmc import BmcError
from provisioner.bmc.credentials import Secret, resolve_password
from provisioner.manifest.nodes import Bmc


def env_bmc(var: str = "BMC_PW") -> Bmc:
    return Bmc(type="ipmi", address="10.0.1.11", user="ADMIN", password_env=var)


def file_bmc(path: Path) -> Bmc:
    return Bmc(type="redfish", address="10.0.1.12", user="admin", password_file=str(path))


def test_secret_never_prints_itself() -> None:
    secret = Secret("hunter2")
    assert secret.reveal() == "hunter2"
    assert "hunter2" not in repr(secret) and "hunter2" not in str(secret) and "hunter2" not in f"{secret}"


def test_password_from_the_environment() -> None:
    assert resolve_password("gpu01", env_bmc(), environ={"BMC_PW": "s3cret"}).reveal() == "s3cret"


@pytest.mark.parametrize("environ", [{}, {"BMC_PW": ""}])
def test_missing_environment_variable_names_node_and_variable(environ: dict[str, str]) -> None:
    with pytest.raises(BmcError) as info:
        resolve_password("gpu01", env_bmc(), environ=environ)
    assert "gpu01" in str(info.value) and "BMC_PW" in str(info.value)
    assert info.value.kind == "config" and info.value.address == "10.0.1.11"


def test_password_from_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "bmc.pass"
    path.write_text("file-secret\n")
    path.chmod(0o600)
    assert resolve_password("gpu02", file_bmc(path)).reveal() == "file-secret"


def test_world_readable_password_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bmc.pass"
    path.write_text("file-secret\n")
    path.chmod(0o644)
    with pytest.raises(BmcError, match="readable by everyone"):
        resolve_password("gpu02", file_bmc(path))


@pytest.mark.parametrize("content, match", [(None, r"\(the BMC password of gpu02\): cannot read it: No such file"),
                                            ("", r"\(the BMC password of gpu02\): empty"),
                                            ("\n", r"\(the BMC password of gpu02\): empty")])
def test_unusable_password_files(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "bmc.pass"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    with pytest.raises(BmcError, match=match):
        resolve_password("gpu02", file_bmc(path))


def test_resolving_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        resolve_password("gpu01", env_bmc(), environ={"BMC_PW": "s3cret-value"})
    assert "s3cret-value" not in caplog.text
