"""provisioner.areas.slurm.containers: enroot + pyxis decisions (AppArmor per OS, data paths,
which nodes, the source mirror, the registry logins and their secret) and the manifest's
containers section."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas import registry
from provisioner.areas.registry import groups
from provisioner.areas.slurm import containers, prepare, rolevars
from provisioner.errors import ProvisionError
from provisioner.manifest import Manifest
from provisioner.state import StateDir


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


# ------------------------------------------------------------------------ registry logins
NGC = {"host": "nvcr.io", "login": "$oauthtoken", "password_env": "NGC_TOKEN"}


def test_inline_registry_password_is_refused_at_its_line(kit: Any) -> None:
    data = with_containers(kit, registry_logins=[{"host": "nvcr.io", "login": "$oauthtoken", "password": "x"}])
    text = kit.text(data)
    diag = kit.error(text, "inline registry passwords (password) is not allowed")
    assert "password_env" in diag.message and "password_file" in diag.message
    assert diag.line == kit.line_of(text, "- host: nvcr.io")


@pytest.mark.parametrize(("login", "needle", "message"), [
    ({"host": "https://nvcr.io", "login": "u", "password_env": "T"}, "host: https", "not a registry host"),
    ({"host": "nvcr.io/nvidia", "login": "u", "password_env": "T"}, "host: nvcr.io/nvidia", "not a registry host"),
    ({"host": "nvcr.io", "login": "two words", "password_env": "T"}, "login: two words", "not a login enroot"),
    ({"host": "nvcr.io", "login": "u", "password_env": "T", "password_file": "/etc/t"}, "- host", "exactly one"),
    ({"host": "nvcr.io", "login": "u"}, "- host", "exactly one of password_env or password_file"),
    ({"host": "nvcr.io", "login": "u", "password_file": "token"}, "- host", "must be an absolute path"),
    ({"host": "nvcr.io", "login": "u", "password_env": "1X"}, "- host", "not an environment variable name"),
])
def test_bad_registry_login_is_an_error_at_its_line(kit: Any, login: dict[str, str], needle: str,
                                                    message: str) -> None:
    text = kit.text(with_containers(kit, registry_logins=[login]))
    assert kit.error(text, message).line == kit.line_of(text, needle)


def test_two_logins_for_one_host_are_an_error_at_the_second(kit: Any) -> None:
    logins = [{"host": "registry.site:5000", "login": "a", "password_env": "A"},
              {"host": "registry.site:5001", "login": "b", "password_env": "B"}]
    text = kit.text(with_containers(kit, registry_logins=logins))
    diag = kit.error(text, "already logs in to registry.site")
    assert diag.line == kit.line_of(text, "host: registry.site:5001")


def test_registry_group_must_be_declared(kit: Any) -> None:
    data = with_containers(kit, registry_logins=[NGC], registry_group="ml")
    text = kit.text(data)
    assert kit.error(text, "unknown group 'ml'").line == kit.line_of(text, "registry_group:")
    data["groups"] = [{"name": "ml", "gid": 3000}]
    m = manifest(kit, data)
    assert rolevars.cluster_vars(m)["containers_registry_group"] == "ml"


def test_logins_without_containers_are_a_warning(kit: Any) -> None:
    data = with_containers(kit, registry_logins=[NGC])
    data["slurm"]["containers"]["enabled"] = False
    text = kit.text(data)
    warnings = [d for d in kit.load(text).warnings if "these logins are not used" in d.message]
    assert len(warnings) == 1 and warnings[0].line == kit.line_of(text, "registry_logins:")
    assert containers.cluster_vars(manifest(kit, data)) == {}


def test_role_vars_hold_the_credentials_path_never_a_password(kit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGC_TOKEN", "s3cret-token")
    m = manifest(kit, with_containers(kit, registry_logins=[NGC]))
    got = rolevars.cluster_vars(m)
    assert got["containers_registry_credentials"] == "{{ provision_state_dir }}/secrets/enroot-credentials"
    assert got["containers_registry_group"] == ""
    assert "s3cret-token" not in repr(got)
    assert {"containers_registry_credentials", "containers_registry_group"} <= rolevars.LIGHT_KEYS
    assert rolevars.cluster_vars(manifest(kit, with_containers(kit)))["containers_registry_credentials"] == ""


def test_secret_envs_reach_the_registry(kit: Any) -> None:
    logins = [NGC, {"host": "registry.site", "login": "robot", "password_file": "/etc/provision/robot"}]
    m = manifest(kit, with_containers(kit, registry_logins=logins))
    assert registry.secret_envs(m) >= {"NGC_TOKEN"}
    assert containers.secret_envs(m) == {"NGC_TOKEN"}


def test_machine_drops_the_port() -> None:
    assert containers.machine("registry.site:5000") == "registry.site"
    assert containers.machine("nvcr.io") == "nvcr.io"


@pytest.mark.parametrize(("value", "why"), [
    ("", "is empty"),
    ("$(id)", "shell"),
    ("two words", "blank"),
    ('"quoted', "quote"),
])
def test_password_enroot_cannot_hold(value: str, why: str) -> None:
    problem = containers.password_problem(value)
    assert problem is not None and why in problem
    assert containers.password_problem("nvapi-abc$def") is None


def test_prepare_writes_one_netrc_line_per_login(kit: Any, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "robot"
    token.write_text("robot-pass\n")
    token.chmod(0o600)
    logins = [NGC, {"host": "registry.site:5000", "login": "robot", "password_file": str(token)}]
    monkeypatch.setenv("NGC_TOKEN", "nvapi-123")
    loaded = kit.load(with_containers(kit, registry_logins=logins))
    state = StateDir(tmp_path / ".provision")
    prepare.prepare(loaded, state)
    path = state.secrets / "enroot-credentials"
    assert path.read_text() == ("machine nvcr.io login $oauthtoken password nvapi-123\n"
                                "machine registry.site login robot password robot-pass\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (state.secrets / "munge.key").is_file()  # the area's other secret, as before
    values = registry.secret_values(state)
    assert "nvapi-123" in values and "robot-pass" in values

    prepare.prepare(kit.load(with_containers(kit)), state)  # logins removed from the manifest
    assert not path.exists() and "nvapi-123" not in registry.secret_values(state)


@pytest.mark.parametrize(("setup", "message"), [
    ("unset", "environment variable NGC_TOKEN is empty or unset"),
    ("dollar", "starts with $"),
    ("world", "readable by everyone; run chmod o-r"),
    ("dir", "(the registry password for nvcr.io): not a regular file"),
    ("missing", "cannot read"),
])
def test_prepare_refuses_in_words_that_never_show_the_password(kit: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               setup: str, message: str) -> None:
    token = tmp_path / "token"
    if setup == "world":
        token.write_text("hunter2-secret\n")
        token.chmod(0o644)
    elif setup == "dir":
        token.mkdir()
    monkeypatch.delenv("NGC_TOKEN", raising=False)
    if setup == "dollar":
        monkeypatch.setenv("NGC_TOKEN", "$hunter2-secret")
    login = dict(NGC) if setup in ("unset", "dollar") else {"host": "nvcr.io", "login": "u",
                                                             "password_file": str(token)}
    state = StateDir(tmp_path / ".provision")
    with pytest.raises(ProvisionError) as info:
        prepare.prepare(kit.load(with_containers(kit, registry_logins=[login])), state)
    assert message in str(info.value) and "slurm.containers.registry_logins[0] (nvcr.io)" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert not (state.secrets / "enroot-credentials").exists()


def test_the_role_installs_the_logins_in_a_light_play_without_logging_them() -> None:
    root = Path(__file__).resolve().parents[3]
    tasks = yaml.safe_load((root / "roles/containers/tasks/registry.yml").read_text())
    reading = [t for t in tasks if "containers_registry_credentials" in str(t.get("ansible.builtin.copy", ""))]
    assert reading and all(t.get("no_log") is True for t in reading)
    plays = yaml.safe_load((root / "playbooks/slurm.yml").read_text())
    light = [p for p in plays if "tasks_from: registry" in yaml.safe_dump(p).replace("'", "")]
    assert len(light) == 1 and light[0]["hosts"] == "slurm_containers"  # every apply, not only targets
