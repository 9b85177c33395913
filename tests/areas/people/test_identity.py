"""identity: local (default) or sssd: the manifest's section, what validate refuses at
file:line, the sssd role's variables and sssd.conf, the bind secret's preparation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from provisioner.areas.people import secrets, verify
from provisioner.areas.people.rolevars import LIGHT_KEYS, cluster_vars
from provisioner.errors import ProvisionError
from provisioner.state import StateDir

ROLE = Path(__file__).resolve().parents[3] / "roles" / "sssd"
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _sssd(**over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uris": ["ldaps://ldap1.example.org", "ldaps://ldap2.example.org:636"],
        "search_base": "dc=example,dc=org",
        "ca_file": "/etc/provision/ldap-ca.pem",
        "bind_dn": "cn=reader,dc=example,dc=org",
        "bind_password_env": "LDAP_BIND_PASSWORD",
        "id_range": {"first": 10000, "last": 19999},
    }
    out.update(over)
    return out


def _data(kit: Any, **over: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    data["identity"] = {"provider": "sssd", "sssd": _sssd(**over)}
    data["groups"] = [{"name": "vision", "gid": 3000}]
    data["users"] = [
        {"name": "carol", "account": None, "email": "carol@example.org"},  # a directory person
        {"name": "svc-train", "uid": 5001, "group": "vision"},  # a local account beside the directory
    ]
    del data["users"][0]["account"]
    return data


# ------------------------------------------------------------------ the manifest and validate
def test_local_identity_is_the_default_and_every_user_needs_a_uid(kit: Any) -> None:
    data: dict[str, Any] = kit.base()
    data["users"] = [{"name": "alice", "uid": 2001}, {"name": "bob"}]
    text = kit.dump(data)
    diag = kit.error(text, "'bob' needs a uid (identity.provider is local")
    assert (diag.path, diag.line) == ("users[1]", kit.line_of(text, "name: bob"))


def test_with_sssd_a_user_without_uid_is_a_directory_person(kit: Any) -> None:
    m = kit.load(_data(kit)).manifest
    assert m.identity.provider == "sssd" and m.identity.sssd.start_tls is False
    assert [u.name for u in m.users if u.uid is None] == ["carol"]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("uris", ["ldap://a.example.org", "ldaps://b.example.org"], "uris mix ldaps:// and ldap://"),
    ("uris", ["http://a.example.org"], "is not ldaps://host[:port]"),
    ("uris", [], "at least 1 item"),
    ("search_base", "example.org", "is not a distinguished name"),
    ("search_base", "dc=example\ncn=x", "is not a distinguished name"),
    ("id_range", {"first": 5000, "last": 4000}, "first 5000 is above last 4000"),
    ("id_range", {"first": 500, "last": 4000}, "greater than or equal to 1000"),
    ("ca_file", "ca.pem", "absolute"),
    ("access_filter", "memberOf=cn=hpc", "should match pattern"),
])
def test_a_bad_directory_setting_is_refused_at_its_line(kit: Any, field: str, value: Any, message: str) -> None:
    diags = kit.errors(_data(kit, **{field: value}))
    assert any(message in d.message and d.path.startswith("identity.sssd") for d in diags), \
        [d.format() for d in diags]


def test_an_inline_bind_password_is_refused(kit: Any) -> None:
    assert "inline LDAP bind passwords (bind_password) is not allowed" in kit.errors(
        _data(kit, bind_password="hunter2"))[0].message


def test_a_bind_dn_needs_its_password_and_a_password_its_dn(kit: Any) -> None:
    kit.error(_data(kit, bind_password_env=None), "bind_dn needs bind_password_env or bind_password_file")
    kit.error(_data(kit, bind_dn=None), "a bind password needs bind_dn")
    kit.error(_data(kit, bind_password_file="/run/pw"), "give only one of bind_password_env or bind_password_file")
    anonymous = kit.load(_data(kit, bind_dn=None, bind_password_env=None)).manifest
    assert anonymous.identity.sssd.bind_dn is None


def test_provider_and_section_go_together(kit: Any) -> None:
    data = _data(kit)
    del data["identity"]["sssd"]
    kit.error(data, "provider sssd needs an sssd: section")
    data = _data(kit)
    data["identity"]["provider"] = "local"
    kit.error(data, "an sssd: section needs provider: sssd")


def test_local_ids_inside_the_directorys_range_are_refused_at_their_line(kit: Any) -> None:
    data = _data(kit)
    data["users"][1]["uid"] = 15000
    data["groups"][0]["gid"] = 10000
    data["cluster"]["admin_users"][0]["uid"] = 19999
    text = kit.dump(data)
    errors = {d.path: d for d in kit.errors(text)}
    assert "inside identity.sssd.id_range 10000..19999" in errors["users[1].uid"].message
    assert errors["users[1].uid"].line == kit.line_of(text, "uid: 15000")
    assert "local group 'vision'" in errors["groups[0].gid"].message
    assert "admin user" in errors["cluster.admin_users[0].uid"].message
    data["users"][1]["uid"] = 9999  # just below the range: fine
    data["groups"][0]["gid"] = 20000
    data["cluster"]["admin_users"][0]["uid"] = 2000
    kit.load(data)


def test_a_directory_person_with_a_local_accounts_settings_is_refused(kit: Any) -> None:
    data = _data(kit)
    data["users"][0].update({"group": "vision", "ssh_keys": [kit.ssh_key], "state": "locked"})
    text = kit.dump(data)
    errors = {d.path: d.message for d in kit.errors(text)}
    assert set(errors) == {"users[0].group", "users[0].ssh_keys", "users[0].state"}
    assert "'carol' has no uid, so is a directory person: their ssh_keys comes from the directory" in \
        errors["users[0].ssh_keys"]


def test_names_still_clash_with_admins_and_each_other(kit: Any) -> None:
    data = _data(kit)
    data["users"].append({"name": "carol"})
    assert kit.error(data, "'carol' is already users[0]").path == "users[2].name"
    data = _data(kit)
    data["users"][0]["name"] = data["cluster"]["admin_users"][0]["name"]
    assert kit.error(data, "is already admin user").path == "users[0].name"


# ------------------------------------------------------------------ role variables
def test_local_identity_keeps_its_variables(kit: Any) -> None:
    data: dict[str, Any] = kit.base()
    data["users"] = [{"name": "alice", "uid": 2001}]
    cv = cluster_vars(kit.load(data).manifest)
    assert set(cv) == {"users_groups", "users_people", "users_home_mode"}  # no fingerprint moves


def test_sssd_variables_name_the_secret_never_its_value(kit: Any) -> None:
    cv = cluster_vars(kit.load(_data(kit, uris=["ldap://ldap.example.org"])).manifest)
    assert [p["name"] for p in cv["users_people"]] == ["svc-train"]  # carol is never made locally
    assert cv["users_directory_people"] == [{"name": "carol", "home": "/home/carol"}]
    assert cv["sssd_start_tls"] is True and cv["sssd_ldap_uris"] == ["ldap://ldap.example.org"]
    assert cv["sssd_bind_password_file"] == "{{ provision_state_dir }}/secrets/people/bind_password"
    assert (cv["sssd_min_id"], cv["sssd_max_id"], cv["sssd_home_dir"], cv["sssd_mkhomedir"]) == (
        10000, 19999, "/home/%u", True)
    assert set(cv) <= LIGHT_KEYS  # a light play: a change re-renders, no heavy play re-runs
    anonymous = cluster_vars(kit.load(_data(kit, bind_dn=None, bind_password_env=None)).manifest)
    assert (anonymous["sssd_bind_dn"], anonymous["sssd_bind_password_file"]) == ("", "")


def test_nfs_homes_turn_pam_mkhomedir_off_and_keep_the_homes_path(kit: Any) -> None:
    data = _data(kit)
    data.update({k: v for k, v in kit.base(storage=True).items() if k in ("zfs", "nfs")})
    data["nfs"]["exports"].append({"name": "homes", "node": "head01", "dataset": "tank/data"})
    data["nfs"]["mounts"].append({"export": "homes", "path": "/users", "nodes": ["@compute"]})
    data["homes"] = {"export": "homes", "path": "/users"}
    cv = cluster_vars(kit.load(data).manifest)
    assert (cv["sssd_home_dir"], cv["sssd_mkhomedir"]) == ("/users/%u", False)
    assert cv["users_directory_people"] == [{"name": "carol", "home": "/users/carol"}]


# ------------------------------------------------------------------ sssd.conf
def _render(variables: dict[str, Any]) -> dict[str, str]:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    secret = {"read": ""}

    def lookup(kind: str, path: str) -> str:
        assert kind == "ansible.builtin.file"
        secret["read"] = path
        return "s3cret"

    text = env.get_template("sssd.conf.j2").render(**{**defaults, **variables}, lookup=lookup)
    domain = text.split("[domain/directory]\n", 1)[1]
    out: dict[str, str] = {}
    for line in domain.splitlines():
        key, _, value = line.partition(" = ")
        assert key not in out, f"{key} set twice"
        out[key] = value
    out["__read"] = secret["read"]
    return out


def test_sssd_conf_always_verifies_tls_and_binds_with_the_secret_file(kit: Any) -> None:
    cv = cluster_vars(kit.load(_data(kit, user_search_base="ou=people,dc=example,dc=org")).manifest)
    cv["sssd_bind_password_file"] = "/state/secrets/people/bind_password"
    conf = _render(cv)
    assert conf["ldap_uri"] == "ldaps://ldap1.example.org, ldaps://ldap2.example.org:636"
    assert (conf["ldap_tls_reqcert"], conf["ldap_tls_cacert"], conf["ldap_id_use_start_tls"]) == (
        "demand", "/etc/sssd/ldap-ca.pem", "false")
    assert (conf["ldap_default_bind_dn"], conf["ldap_default_authtok"]) == ("cn=reader,dc=example,dc=org", "s3cret")
    assert conf["__read"] == "/state/secrets/people/bind_password"
    assert (conf["min_id"], conf["max_id"], conf["override_homedir"]) == ("10000", "19999", "/home/%u")
    assert conf["ldap_user_search_base"] == "ou=people,dc=example,dc=org" and "ldap_group_search_base" not in conf
    assert conf["access_provider"] == "permit"


def test_sssd_conf_starttls_anonymous_and_an_access_filter(kit: Any) -> None:
    m = kit.load(_data(kit, uris=["ldap://ldap.example.org"], bind_dn=None, bind_password_env=None,
                       access_filter="(memberOf=cn=hpc,ou=groups,dc=example,dc=org)")).manifest
    conf = _render(cluster_vars(m))
    assert conf["ldap_id_use_start_tls"] == "true" and "ldap_default_authtok" not in conf and not conf["__read"]
    assert (conf["access_provider"], conf["ldap_access_filter"]) == (
        "ldap", "(memberOf=cn=hpc,ou=groups,dc=example,dc=org)")


# ------------------------------------------------------------------ the bind secret (edge)
def test_prepare_copies_the_password_privately_and_checks_the_ca(kit: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(CA)
    loaded = kit.load(_data(kit, ca_file=str(ca)))
    state = StateDir(tmp_path / "state")
    monkeypatch.delenv("LDAP_BIND_PASSWORD", raising=False)
    with pytest.raises(ProvisionError, match="LDAP_BIND_PASSWORD is empty, unset"):
        secrets.prepare_directory(loaded, state)
    monkeypatch.setenv("LDAP_BIND_PASSWORD", "pa ss;#word")
    secrets.prepare_directory(loaded, state)
    target = state.secrets / "people" / "bind_password"
    assert target.read_text() == "pa ss;#word" and os.stat(target).st_mode & 0o777 == 0o600
    assert secrets.secret_values(state) == ["pa ss;#word"]
    assert secrets.secret_envs(loaded.manifest) == {"LDAP_BIND_PASSWORD"}
    ca.write_text("not a certificate\n")
    with pytest.raises(ProvisionError, match="holds no PEM certificate"):
        secrets.prepare_directory(loaded, state)
    secrets.prepare_directory(kit.load(kit.base()), state)  # local identity again: the secret goes
    assert not target.exists() and secrets.secret_values(state) == []


def test_a_password_file_readable_by_everyone_is_refused(kit: Any, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(CA)
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    pw.chmod(0o644)
    loaded = kit.load(_data(kit, ca_file=str(ca), bind_password_env=None, bind_password_file=str(pw)))
    with pytest.raises(ProvisionError, match="readable by everyone") as info:
        secrets.prepare_directory(loaded, StateDir(tmp_path / "state"))
    assert "secret" not in str(info.value).replace("secrets", "")
    pw.chmod(0o600)
    secrets.prepare_directory(loaded, StateDir(tmp_path / "state"))
    assert secrets.secret_values(StateDir(tmp_path / "state")) == ["secret"]


# ------------------------------------------------------------------ verify
def test_verify_resolves_directory_people_inside_the_range(kit: Any) -> None:
    m = kit.load(_data(kit)).manifest
    check = verify.checks(m)(m.nodes[0], "")[0]
    assert check.command.text == "getent passwd carol svc-train; getent group vision; true"
    judge = verify.ids_verdict(m)
    local = "svc-train:x:5001:3000::/home/svc-train:/bin/bash\nvision:x:3000:\n"
    good = judge(verify.parse_getent("carol:*:10007:10007:Carol:/home/carol:/bin/bash\n" + local))
    assert good.status == "PASS" and "1 directory people resolved through sssd" in good.detail
    missing = judge(verify.parse_getent(local))
    assert missing.status == "FAIL"
    assert "no user carol (not in the directory, or sssd cannot reach it)" in missing.detail
    shadowed = judge(verify.parse_getent("carol:x:2002:2002::/home/carol:/bin/bash\n" + local))
    assert "outside the directory's id_range 10000..19999 (a local account?)" in shadowed.detail
