"""provisioner.areas.people: what validate says about users:, groups: and homes:, at file:line."""

from __future__ import annotations

from typing import Any

import pytest


def _people(kit: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base(storage=True)
    data["groups"] = [{"name": "vision", "gid": 3000}, {"name": "nlp", "gid": 3001}]
    data["users"] = [
        {"name": "alice", "uid": 2001, "group": "vision", "groups": ["nlp"], "ssh_keys": [kit.ssh_key]},
        {"name": "bob", "uid": 2002},
    ]
    return data


def test_a_clean_people_section_loads(kit: Any) -> None:
    loaded = kit.load(_people(kit))
    assert [u.name for u in loaded.manifest.users] == ["alice", "bob"]
    assert not loaded.warnings


def test_two_users_with_one_uid_is_an_error_at_the_second_uid(kit: Any) -> None:
    data = _people(kit)
    data["users"][1]["uid"] = 2001
    text = kit.dump(data)
    diag = kit.error(text, "uid 2001 of 'bob' is already 'alice''s")
    assert (diag.file, diag.path) == ("m.yaml", "users[1].uid")
    assert diag.line == kit.line_of(text, "uid: 2001", 2)


def test_a_users_own_group_on_a_declared_gid_is_an_error(kit: Any) -> None:
    data = _people(kit)
    data["users"][1]["uid"] = 3001  # bob's own group would take nlp's gid
    diag = kit.error(data, "already group 'nlp''s")
    assert diag.path == "users[1].uid"


def test_a_group_declared_twice_or_on_a_taken_gid_is_an_error(kit: Any) -> None:
    data = _people(kit)
    data["groups"].append({"name": "vision", "gid": 3000})
    errors = kit.errors(data)
    assert {(d.path, d.message) for d in errors} >= {
        ("groups[2].name", "group 'vision' is declared twice"),
        ("groups[2].gid", "gid 3000 of group 'vision' is already group 'vision''s"),
    }


def test_a_user_named_like_an_admin_or_a_group_is_an_error(kit: Any) -> None:
    data = _people(kit)
    data["users"][1]["name"] = "ops"
    assert kit.error(data, "'ops' is already admin user 'ops'").path == "users[1].name"
    data = _people(kit)
    data["users"][1]["name"] = "nlp"
    assert "set group: to use it" in kit.error(data, "its own group would be group 'nlp'").message


def test_an_undeclared_group_is_an_error_at_its_name(kit: Any) -> None:
    data = _people(kit)
    data["users"][0]["groups"] = ["nlp", "audio"]
    text = kit.dump(data)
    diag = kit.error(text, "'alice': group 'audio' is not in groups:")
    assert diag.path == "users[0].groups[1]"
    assert diag.line == kit.line_of(text, "- audio")
    data["users"][0]["group"] = "speech"
    assert kit.error(data, "group 'speech' is not in groups:").path == "users[0].group"


def test_a_uid_below_1000_is_an_error_at_the_uid(kit: Any) -> None:
    data = _people(kit)
    data["users"][1]["uid"] = 999
    text = kit.dump(data)
    diag = kit.error(text, "999 is outside 1000..60000")
    assert diag.line == kit.line_of(text, "uid: 999")
    data = _people(kit)
    data["groups"][0]["gid"] = 100
    assert kit.error(data, "100 is outside 1000..60000").path.startswith("groups[0].gid")


def test_a_key_that_is_no_ssh_public_key_is_an_error_at_the_key(kit: Any) -> None:
    data = _people(kit)
    data["users"][0]["ssh_keys"] = ["-----BEGIN OPENSSH PRIVATE KEY-----"]
    text = kit.dump(data)
    diag = kit.error(text, "is not an OpenSSH public key")
    assert diag.line == kit.line_of(text, "BEGIN OPENSSH")
    assert "PRIVATE KEY-" not in diag.message[40:]  # the key is shown cut short


def test_homes_on_an_export_that_does_not_exist_is_an_error(kit: Any) -> None:
    data = _people(kit)
    data["homes"] = {"export": "homes"}
    text = kit.dump(data)
    diag = kit.error(text, "no nfs.exports entry is named 'homes' (exports: data)")
    assert diag.line == kit.line_of(text, "export: homes")


def test_homes_on_an_export_nobody_mounts_at_the_homes_path_is_a_warning(kit: Any) -> None:
    data = _people(kit)
    data["nfs"]["exports"].append({"name": "homes", "node": "head01", "path": "/srv/home"})
    data["homes"] = {"export": "homes"}
    warnings = [d for d in kit.load(data).warnings if d.path == "homes.export"]
    assert len(warnings) == 1 and "mounts 'homes' at /home" in warnings[0].message
    data["nfs"]["mounts"].append({"export": "homes", "path": "/home", "nodes": ["@compute"]})
    assert not kit.load(data).warnings


def test_a_system_accounts_name_is_refused_for_users_and_groups(kit: Any) -> None:
    data = _people(kit)
    data["users"][1]["name"] = "root"
    assert kit.error(data, "'root' is a system account's name").path == "users[1].name"
    data = _people(kit)
    data["groups"][0]["name"] = "docker"
    assert kit.error(data, "'docker' is a system group's name").path == "groups[0].name"


def test_a_users_email_is_an_address(kit: Any) -> None:
    data = _people(kit)
    data["users"][0]["email"] = "alice.b+gpu@vision.example.org"
    assert kit.load(data).manifest.users[0].email == "alice.b+gpu@vision.example.org"
    data["users"][1]["email"] = "bob at example.org"
    text = kit.dump(data)
    diag = kit.error(text, "'bob at example.org' is not an e-mail address")
    assert diag.path == "users[1].email"
    assert diag.line == kit.line_of(text, "email: bob at example.org")


@pytest.mark.parametrize("address", [
    "{{ .CommonLabels.user }}@example.org",  # Alertmanager would render it as a template
    "alice,bob@example.org", '"alice"@example.org', "Alice <alice@example.org>",  # a list, a display name
    "alice..b@example.org", ".alice@example.org", "alice@-example.org", "alice@",
])
def test_an_email_alertmanager_would_misread_is_refused(kit: Any, address: str) -> None:
    data = _people(kit)
    data["users"][1]["email"] = address
    assert kit.error(data, "is not an e-mail address").path == "users[1].email"
