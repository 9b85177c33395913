"""Every molecule host is reached over the test bed's SSH (docs/design.md, "Test bed").

molecule writes the podman plugin's ``ansible_connection: podman`` on each host of its
inventory file; only a host_vars entry outranks it. A platform without one would silently
fall back to several ``podman exec`` per module (minutes more per scenario), and a verifier
with podman:// hosts to one per command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent for p in (ROOT / "molecule").glob("*/molecule.yml"))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_every_platform_connects_over_ssh(scenario: Path) -> None:
    config = yaml.safe_load((scenario / "molecule.yml").read_text())
    host_vars = ((config.get("provisioner") or {}).get("inventory") or {}).get("host_vars") or {}
    for platform in config["platforms"]:
        got = (host_vars.get(platform["name"]) or {}).get("ansible_connection")
        assert got == "ssh", f"{scenario.name}: {platform['name']} has ansible_connection {got!r}, not ssh"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_no_verifier_uses_the_podman_backend(scenario: Path) -> None:
    texts = [scenario / "molecule.yml", *sorted((scenario / "tests").glob("*.py"))]
    offenders = [p.relative_to(ROOT).as_posix() for p in texts if p.is_file() and "podman://" in p.read_text()]
    assert offenders == []


def test_the_shared_config_proxies_ssh_through_podman_exec() -> None:
    config = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())
    all_vars = config["provisioner"]["inventory"]["group_vars"]["all"]
    assert all_vars["ansible_ssh_pipelining"] is True
    assert 'ProxyCommand="podman exec -i %h /usr/local/sbin/testbed-sshd-stdio"' in all_vars["ansible_ssh_common_args"]
    assert "ControlPersist" in all_vars["ansible_ssh_common_args"]
    setup = (ROOT / "tests" / "testbed" / "setup.sh").read_text()
    assert all_vars["ansible_ssh_private_key_file"] in setup
    assert "/usr/local/sbin/testbed-sshd-stdio" in setup
