"""provisioner.areas.people.rolevars: the users role's variables from the manifest."""

from __future__ import annotations

from typing import Any

from provisioner.areas.people.rolevars import cluster_vars, node_vars


def _manifest(kit: Any, homes: dict[str, Any] | None = None) -> Any:
    data: dict[str, Any] = kit.base(storage=True)
    data["groups"] = [{"name": "vision", "gid": 3000}]
    data["users"] = [
        {"name": "alice", "uid": 2001, "group": "vision", "ssh_keys": [kit.ssh_key], "comment": "Alice A"},
        {"name": "bob", "uid": 2002, "groups": ["vision"], "state": "locked"},
    ]
    data["nfs"]["exports"].append({"name": "homes", "node": "head01", "dataset": "tank/data"})
    data["nfs"]["mounts"].append({"export": "homes", "path": "/home", "nodes": ["@compute"]})
    if homes is not None:
        data["homes"] = homes
    return kit.load(data).manifest


def test_every_user_gets_a_primary_group_and_gid_and_the_users_own_groups_are_made(kit: Any) -> None:
    cv = cluster_vars(_manifest(kit))
    assert cv["users_groups"] == [{"name": "vision", "gid": 3000}, {"name": "bob", "gid": 2002}]
    alice, bob = cv["users_people"]
    assert (alice["group"], alice["gid"], alice["home"], alice["comment"]) == ("vision", 3000, "/home/alice", "Alice A")
    assert (bob["group"], bob["gid"], bob["groups"], bob["state"]) == ("bob", 2002, ["vision"], "locked")
    assert cv["users_home_mode"] == "0700"


def test_local_homes_are_made_on_every_node(kit: Any) -> None:
    m = _manifest(kit, {"path": "/users", "mode": "750"})
    assert {n.name: node_vars(m, n)["users_home_root"] for n in m.nodes} == {
        "head01": "/users", "node01": "/users", "node02": "/users"}
    assert cluster_vars(m)["users_home_mode"] == "0750"
    assert cluster_vars(m)["users_people"][0]["home"] == "/users/alice"


def test_homes_on_an_export_are_made_on_its_server_in_the_exported_directory(kit: Any) -> None:
    m = _manifest(kit, {"export": "homes"})
    roots = {n.name: node_vars(m, n)["users_home_root"] for n in m.nodes}
    assert roots == {"head01": "/tank/data", "node01": "", "node02": ""}


def test_no_users_no_node_variables(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert [node_vars(m, n) for n in m.nodes] == [{}, {}, {}]
    assert cluster_vars(m) == {"users_groups": [], "users_people": [], "users_home_mode": "0700"}
