"""`provision backup` / `provision restore`: the tool's command lines on the head (a fake SSH
edge), the admin host's .provision/ encrypted before it leaves, exit codes and --json."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import backup as backup_cmd
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]
KEY = "correct horse battery staple"
NAME = "provision-backup-testc-20261127T023005Z"


def _data(kit: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    data["backup"] = {"destination": {"ssh": {"host": "vault.example.org", "path": "/srv/heads"}},
                      "key_env": "TEST_BACKUP_KEY"}
    return data


def fake(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Output]) -> tuple[list[str], list[bytes]]:
    sent: list[str] = []
    uploaded: list[bytes] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        assert set(targets) == {"head01"}

        def execute(host: str, text: str, timeout: int) -> Output:
            sent.append(text)
            return next((out for word, out in answers.items() if word in text), Output())
        return execute

    def upload(target: SshTarget, known_hosts: Path, local: Path, text: str, timeout: int) -> None:
        sent.append(text)
        uploaded.append(local.read_bytes())

    monkeypatch.setattr(backup_cmd, "ssh_executor", executor)
    monkeypatch.setattr(backup_cmd, "upload", upload)
    return sent, uploaded


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
def test_backup_sends_provision_encrypted_then_makes_one(write_manifest: Any, kit: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    monkeypatch.setenv("TEST_BACKUP_KEY", KEY)
    path = write_manifest(_data(kit))
    (path.parent / ".provision" / "images").mkdir(parents=True)
    (path.parent / ".provision" / "images" / "ubuntu.tar.zst").write_bytes(b"big")
    sent, uploaded = fake(monkeypatch, {" make ": Output(stdout=NAME + "\n")})
    assert main(["backup", str(path)]) == 0
    assert sent[0].startswith("sh -c ") and "cat > /var/lib/provision-backup/incoming/" in sent[0]
    assert sent[1] == ("python3 /usr/local/sbin/provision-backup make /etc/provision-backup/config.json "
                       "--extra provision-state=/var/lib/provision-backup/incoming/provision-state.tar.gz.enc")
    assert capsys.readouterr().out.strip() == f"{NAME}: made on head01, at root@vault.example.org:/srv/heads"
    blob = tmp_path / "part.enc"
    blob.write_bytes(uploaded[0])
    assert uploaded[0][:8] == b"Salted__"
    clear = subprocess.run(["openssl", "enc", "-d", "-aes-256-cbc", "-pbkdf2", "-iter", "200000", "-pass",
                            f"pass:{KEY}", "-in", str(blob)], capture_output=True, check=True, timeout=30).stdout
    with tarfile.open(fileobj=io.BytesIO(clear), mode="r:gz") as tar:
        names = tar.getnames()
    assert "./known_hosts" in names and "./secrets" in names and not any(n.startswith("./images") for n in names)

    sent.clear()
    assert main(["backup", str(path), "--to", "/mnt/usb", "--json"]) == 0
    assert """--to '{"kind": "local", "path": "/mnt/usb"}'""" in sent[1]
    assert json.loads(capsys.readouterr().out) == {"backup": NAME, "destination": "/mnt/usb", "head": "head01"}


def test_backup_needs_the_key_and_a_backup_section(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: Capsys) -> None:
    monkeypatch.delenv("TEST_BACKUP_KEY", raising=False)
    sent, _ = fake(monkeypatch, {})
    assert main(["backup", str(write_manifest(_data(kit)))]) == 1
    assert "TEST_BACKUP_KEY is empty or unset" in capsys.readouterr().err
    assert main(["backup", str(write_manifest(kit.base(), "bare.yaml"))]) == 1
    assert "no backup section" in capsys.readouterr().err
    assert sent == []


def test_restore_shows_the_plan_and_needs_yes(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                              capsys: Capsys) -> None:
    path = write_manifest(_data(kit))
    plan = "stop slurmctld\noverwrite /var/lib/slurm/slurmctld from slurmctld-state.tar.gz\nstart slurmctld\n"
    sent, _ = fake(monkeypatch, {"--yes": Output(stdout=plan),
                                 " restore ": Output(rc=2, stdout=plan, stderr="provision-backup: nothing changed: "
                                                     "this overwrites the lines above; run again with --yes")})
    assert main(["restore", str(path), "--from", NAME]) == 2
    captured = capsys.readouterr()
    assert "head01: overwrite /var/lib/slurm/slurmctld from slurmctld-state.tar.gz" in captured.out
    assert "restore refused on head01: provision-backup: nothing changed" in captured.err
    assert sent == [f"python3 /usr/local/sbin/provision-backup restore /etc/provision-backup/config.json {NAME}"]
    assert main(["restore", str(path), "--from", NAME, "--yes"]) == 0
    assert capsys.readouterr().out.endswith(f"{NAME}: restored on head01\n")
    assert main(["restore", str(path), "--from", "../x;rm", "--yes"]) == 1
    assert "give a backup's name" in capsys.readouterr().err


def test_a_failed_restore_says_why(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                   capsys: Capsys) -> None:
    path = write_manifest(_data(kit))
    fake(monkeypatch, {" restore ": Output(rc=1, stderr="provision-backup: munge.tar.gz.enc: cannot decrypt")})
    assert main(["restore", str(path), "--from", NAME, "--yes", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["restored"] is False and doc["refused"] is False and "cannot decrypt" in doc["detail"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
def test_a_head_that_answers_no_backup_name_is_a_failure_in_one_line(
        write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    """A make that exited 0 and printed nothing was 'internal error: IndexError' (exit 70)."""
    monkeypatch.setenv("TEST_BACKUP_KEY", KEY)
    fake(monkeypatch, {" make ": Output(stdout="\n")})
    assert main(["backup", str(write_manifest(_data(kit)))]) == 1
    assert capsys.readouterr().err == "backup failed on head01: the tool answered no backup name\n"
