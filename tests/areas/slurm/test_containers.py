"""provisioner.areas.slurm.containers: enroot + pyxis decisions (AppArmor per OS, data paths,
which nodes, the source mirror) and the manifest's containers section."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas.registry import groups
from provisioner.areas.slurm import containers, rolevars
from provisioner.manifest import Manifest


def with_containers(kit: Any, **section: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    data["slurm"]["containers"] = {"enabled": True, **section}
    return data


def manifest(kit: Any, data: dict[str, Any]) -> Manifest:
    m: Manifest = kit.load(data).manifest
    return m


@pytest.mark.parametrize(("os_name", "action"), [
    ("ubuntu-24.04", "profile"),  # AppArmor restricts unprivileged user namespaces
    ("ubuntu-22.04", "none"),  # no restriction; enroot's AppArmor 4 profile breaks there (enroot#201)
    ("debian-12", "none"),
])
def test_apparmor_plan_per_os(os_name: Any, action: str) -> None:
    plan = containers.apparmor_plan(os_name)
    assert plan.action == action
    assert plan.why


def test_off_by_default_no_vars_no_group(kit: Any) -> None:
    m = manifest(kit, kit.base())
    assert containers.cluster_vars(m) == {}
    assert containers.node_vars(m, m.node("node01")) == {}
    assert groups(m)["slurm_containers"] == set()


def test_compute_and_login_nodes_get_it_not_the_head(kit: Any) -> None:
    data = with_containers(kit)
    login = dict(data["nodes"][0], name="login01", roles=["login"])
    login["interfaces"] = {"management": {"ip": "10.0.0.30"}}
    login.pop("bmc")
    login["hardware"] = {"cpu": {"cores_per_socket": 4}, "memory_gb": 16}
    data["nodes"].append(login)
    m = manifest(kit, data)
    assert groups(m)["slurm_containers"] == {"node01", "node02", "login01"}
    assert containers.node_vars(m, m.node("head01")) == {}
    assert rolevars.node_vars(m, m.node("login01"))["containers_apparmor"] == "profile"


def test_slurm_off_means_no_containers(kit: Any) -> None:
    data = with_containers(kit)
    data["slurm"]["enabled"] = False
    data["slurm"].pop("partitions")
    m = manifest(kit, data)
    assert not containers.enabled(m)
    assert rolevars.cluster_vars(m) == {}


def test_data_and_cache_on_scratch_when_the_node_has_it(kit: Any) -> None:
    data = with_containers(kit)
    data["nodes"][1]["scratch"] = {"path": "/local"}
    m = manifest(kit, data)
    got = rolevars.node_vars(m, m.node("node02"))
    assert got["containers_data_path"] == "/local/enroot/data"
    assert got["containers_cache_path"] == "/local/enroot/cache"


def test_data_under_var_lib_without_scratch(kit: Any) -> None:
    data = with_containers(kit)
    data["nodes"][1]["hardware"]["disks"] = []
    m = manifest(kit, data)
    got = containers.node_vars(m, m.node("node01"))
    assert got["containers_data_path"] == "/var/lib/enroot/data"
    assert got["containers_cache_path"] == "/var/lib/enroot/cache"


def test_default_scratch_path(kit: Any) -> None:
    m = manifest(kit, with_containers(kit))
    assert containers.data_root(m.node("node01")) == "/scratch/enroot"


def test_source_mirror_reaches_the_role(kit: Any) -> None:
    m = manifest(kit, with_containers(kit, source_mirror="https://mirror.site/vendor/"))
    assert rolevars.cluster_vars(m)["containers_source_mirror"] == "https://mirror.site/vendor/"
    assert manifest(kit, with_containers(kit)).slurm.containers.source_mirror is None
    assert rolevars.cluster_vars(manifest(kit, with_containers(kit)))["containers_source_mirror"] == ""


def test_a_mirror_that_is_no_url_is_an_error_at_its_line(kit: Any) -> None:
    data = with_containers(kit, source_mirror="mirror.site/vendor")
    text = kit.text(data)
    diag = kit.error(text, "is not an http(s):// or file:// URL")
    assert diag.line == kit.line_of(text, "source_mirror:")


def test_unknown_key_is_an_error_at_its_line(kit: Any) -> None:
    data = with_containers(kit, registry_password="hunter2")
    text = kit.text(data)
    diag = kit.errors(text)[0]
    assert diag.line == kit.line_of(text, "registry_password")


def test_warns_when_devices_are_not_fenced(kit: Any) -> None:
    data = with_containers(kit)
    data["slurm"]["constrain_devices"] = False
    text = kit.text(data)
    warnings = [d for d in kit.load(text).warnings if "sees every GPU" in d.message]
    assert len(warnings) == 1 and warnings[0].severity == "warning"
    assert warnings[0].line == kit.line_of(text, "enabled: true")
    assert [d for d in kit.load(kit.text(with_containers(kit))).warnings if "sees every GPU" in d.message] == []
