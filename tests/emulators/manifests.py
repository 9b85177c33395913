"""Small manifests for BMC and install tests, built straight from the model (the
emulators share 127.0.0.1, which the whole-manifest checks would reject as duplicate
BMC addresses)."""

from __future__ import annotations

from typing import Any

from provisioner.manifest.model import Manifest

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA ops@laptop"


def node_dict(name: str, index: int, *, roles: tuple[str, ...] = ("compute",), bmc: dict[str, Any] | None = None,
              os: str = "ubuntu-22.04", disks: tuple[str, ...] = ("nvme-TEST_DISK_0",),
              mac: str | None = "auto", install: str | None = None) -> dict[str, Any]:
    """A node entry; ``install`` defaults to pxe for a node with a BMC, else manual."""
    iface: dict[str, Any] = {"ip": f"10.20.0.{10 + index}", "interface": "eno1"}
    if mac == "auto":
        iface["mac"] = f"52:54:00:20:00:{10 + index:02x}"
    elif mac is not None:
        iface["mac"] = mac
    data: dict[str, Any] = {
        "name": name,
        "roles": list(roles),
        "os": os,
        "install_disks": list(disks),
        "interfaces": {"management": iface},
        "hardware": {"cpu": {"cores_per_socket": 8}, "memory_gb": 64},
    }
    if bmc is not None:
        data["bmc"] = bmc
    data["install"] = install or ("pxe" if bmc is not None and "head" not in roles else "manual")
    return data


def manifest(nodes: list[dict[str, Any]], **cluster: Any) -> Manifest:
    data = {
        "version": 1,
        "cluster": {"name": "testlab", "domain": "lab.test",
                    "admin_users": [{"name": "ops", "ssh_keys": [KEY]}], **cluster},
        "networks": {"management": {"cidr": "10.20.0.0/24", "gateway": "10.20.0.1", "dns": ["10.20.0.1"]}},
        "nodes": [node_dict("head", 0, roles=("head",)), *nodes],
    }
    return Manifest.model_validate(data)


def redfish_bmc(port: int, *, env: str = "TEST_BMC_PASSWORD", system_id: str | None = None,
                boot_mode: str = "uefi") -> dict[str, Any]:
    bmc: dict[str, Any] = {"type": "redfish", "address": "127.0.0.1", "port": port, "user": "admin",
                           "password_env": env, "boot_mode": boot_mode}
    if system_id:
        bmc["system_id"] = system_id
    return bmc


def ipmi_bmc(port: int, *, env: str = "TEST_IPMI_PASSWORD", user: str = "admin",
             boot_mode: str = "uefi") -> dict[str, Any]:
    return {"type": "ipmi", "address": "127.0.0.1", "port": port, "user": user, "password_env": env,
            "boot_mode": boot_mode}
