"""provisioner.content: where playbooks/ and roles/ are found, and the Ansible paths to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner import content
from provisioner.content import ansible_paths, project_root
from provisioner.errors import ProvisionError


def test_project_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kit: Any) -> None:
    monkeypatch.delenv("PROVISION_HOME", raising=False)
    assert project_root() == kit.root
    monkeypatch.setenv("PROVISION_HOME", str(kit.root))
    assert project_root() == kit.root
    monkeypatch.setenv("PROVISION_HOME", str(tmp_path))
    with pytest.raises(ProvisionError, match="playbooks not found"):
        project_root()


def fake_collection(base: Path) -> Path:
    root = base.joinpath("ansible_collections", *content.COLLECTION)
    (root / "playbooks").mkdir(parents=True)
    (root / "roles").mkdir()
    (root / "playbooks" / "site.yml").write_text("---\n[]\n")
    return root


def test_the_installed_collection_comes_before_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROVISION_HOME", raising=False)
    installed = fake_collection(tmp_path / "site-packages" / "provisioner")
    monkeypatch.setattr(content, "installed_root", lambda: installed)
    assert project_root() == installed
    monkeypatch.setattr(content, "installed_root", lambda: None)
    monkeypatch.setattr(content, "checkout_root", lambda: tmp_path / "nowhere")
    with pytest.raises(ProvisionError, match="playbooks not found: neither in the installed package"):
        project_root()


def test_a_checkout_has_no_collection_inside_the_package(kit: Any) -> None:
    # the build copies roles/ and playbooks/ into the wheel only; nothing is committed there
    assert content.installed_root() is None
    assert not (kit.root / "provisioner" / "ansible_collections").exists()


def test_ansible_paths(tmp_path: Path, kit: Any) -> None:
    assert ansible_paths(kit.root) == {"ANSIBLE_ROLES_PATH": str(kit.root / "roles")}
    root = fake_collection(tmp_path / "provisioner")
    # roles by their short names, and not in the collection's context (see ansible_paths)
    assert ansible_paths(root) == {"ANSIBLE_ROLES_PATH": str(root / "roles")}
