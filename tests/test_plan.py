"""provisioner.plan: manifest vs recorded state -> per-node status, heavy targets, plays."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from provisioner.areas import registry as rolevars
from provisioner.areas.baremetal import deploy
from provisioner.display import print_plan
from provisioner.manifest import Manifest
from provisioner.plan import (
    PlaySpec,
    cluster_fingerprint,
    compute,
    fingerprint,
    load_plays,
    node_sections,
    resolve_pattern,
)
from provisioner.state import NodeState, State

HEAVY = "all:&{{ provision_targets | default('all') }}"
PLAYS = [
    PlaySpec("common - base system", HEAVY, "common.yml"),
    PlaySpec("common - /etc/hosts", "all", "common.yml"),
    PlaySpec("slurm - compute daemons", "slurm_compute:&{{ provision_targets | default('all') }}", "slurm.yml"),
    PlaySpec("slurm - config files", "slurm_node", "slurm.yml"),
]


def settled(m: Manifest, lifecycle: Any = "configured") -> State:
    """A state recording ``m`` exactly as applied."""
    return State(
        cluster=m.cluster.name,
        nodes={n.name: NodeState(lifecycle=lifecycle, fingerprints=node_sections(m, n)) for n in m.nodes},
        cluster_fingerprint=cluster_fingerprint(m),
    )


def by_name(plan: Any) -> dict[str, Any]:
    return {n.name: n for n in plan.nodes}


@pytest.fixture
def m(kit: Any) -> Manifest:
    return kit.load(kit.base()).manifest  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- fingerprints
def test_fingerprint_is_stable_and_key_order_free() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert len(fingerprint(None)) == 16


def test_node_sections_cover_every_area(m: Manifest) -> None:
    sections = node_sections(m, m.node("node01"))
    assert {"node", "bmc"} | {a.name for a in rolevars.AREAS} == set(sections)
    assert node_sections(m, m.node("node01")) == sections
    assert node_sections(m, m.node("node02"))["node"] != sections["node"]


# --------------------------------------------------------------------------- statuses
def test_everything_new_against_an_empty_state(m: Manifest) -> None:
    plan = compute(m, State(), PLAYS)
    assert [n.status for n in plan.nodes] == ["new", "new", "new"]
    assert all(n.heavy for n in plan.nodes)
    assert plan.targets == ["head01", "node01", "node02"]
    assert plan.cluster_files_change
    assert plan.has_changes
    node01 = by_name(plan)["node01"]
    assert node01.sections == sorted(node_sections(m, m.node("node01")))
    assert node01.lifecycle == "new"
    assert node01.plays == ["common", "common (files)", "slurm", "slurm (files)"]
    assert by_name(plan)["head01"].plays == ["common", "common (files)", "slurm (files)"]


def test_unchanged_when_state_matches(m: Manifest) -> None:
    plan = compute(m, settled(m), PLAYS)
    assert [(n.status, n.sections, n.heavy) for n in plan.nodes] == [("unchanged", [], False)] * 3
    assert plan.targets == []
    assert not plan.cluster_files_change
    assert not plan.has_changes
    # only the light plays run
    assert by_name(plan)["node01"].plays == ["common (files)", "slurm (files)"]
    assert by_name(plan)["head01"].lifecycle == "configured"


# Recorded before the fabric area was split out of storage (one "storage" section for both),
# by the code of that time: llm-200k (InfiniBand) and kit.base(storage=True) with node01 on RoCE.
# That code built node images as .tar.gz (the PXE server's cluster variables name the file):
# the test runs with that name, so it holds the split alone.
PRE_FABRIC_IMAGE_EXT = ".tar.gz"
PRE_FABRIC = {
    "llm-200k": ({"head01": "911723cc15ae33e1", "gpu01": "1afc8c358d5050c1", "gpu02": "0c97eb54ea695d01",
                  "gpu03": "85c48e3fe43656c3", "gpu04": "af73f592798e870b"}, "73a75aab01da7add"),
    "roce": ({"head01": "c067a9b2a4a0b38e", "node01": "c78fb81c177720f5", "node02": "34a1527ca66216a2"},
             "41aba3987066a77c"),
}


def _pre_fabric(kit: Any, name: str) -> Manifest:
    if name == "llm-200k":
        return kit.load(kit.example("llm-200k.yaml")).manifest  # type: ignore[no-any-return]
    data = kit.base(storage=True)
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0"}
    return kit.load(data).manifest  # type: ignore[no-any-return]


def _recorded_before_fabric(m: Manifest, name: str) -> State:
    storage, cluster = PRE_FABRIC[name]
    state = settled(m)
    for node, ns in state.nodes.items():
        del ns.fingerprints["fabric"]
        ns.fingerprints["storage"] = storage[node]
    state.cluster_fingerprint = cluster
    return state


@pytest.mark.parametrize("name", sorted(PRE_FABRIC))
def test_a_state_recorded_before_the_fabric_area_stays_valid(kit: Any, name: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric area (ofed) was split out of storage: a cluster applied before that plans
    no change, and a change of either area's variables shows as storage's, as it did then."""
    monkeypatch.setattr(deploy, "BUILT_IMAGE_EXT", PRE_FABRIC_IMAGE_EXT)
    m = _pre_fabric(kit, name)
    assert cluster_fingerprint(m) == PRE_FABRIC[name][1]
    plan = compute(m, _recorded_before_fabric(m, name), PLAYS)
    assert not plan.has_changes and plan.targets == []
    if name != "llm-200k":
        return
    for change in ({"software": {"ofed": {"source": "doca", "doca_version": "2.9.1"}}},  # a fabric variable
                   {"zfs": {"scrub": "weekly"}}):  # a storage variable
        data = kit.example("llm-200k.yaml")
        for section, value in change.items():
            data[section] |= value
        changed = compute(kit.load(data).manifest, _recorded_before_fabric(m, name), PLAYS)
        assert {tuple(n.sections) for n in changed.nodes} == {("storage",)}, change
        assert changed.targets == m.node_names()


def test_changed_node_names_its_sections(kit: Any, m: Manifest) -> None:
    state = settled(m)
    data = kit.base()
    data["nodes"][0]["hardware"]["memory_gb"] = 96
    changed = kit.load(data).manifest
    plan = compute(changed, state, PLAYS)
    nodes = by_name(plan)
    assert nodes["head01"].status == "changed"
    assert "node" in nodes["head01"].sections
    assert "bmc" not in nodes["head01"].sections
    assert nodes["head01"].heavy
    assert nodes["node01"].status == nodes["node02"].status == "unchanged"
    assert plan.targets == ["head01"]
    assert not plan.cluster_files_change


def test_area_section_changes_on_every_node_for_heavy_cluster_vars(kit: Any, m: Manifest) -> None:
    state = settled(m)
    data = kit.base()
    data["cluster"]["timezone"] = "Europe/Berlin"
    plan = compute(kit.load(data).manifest, state, PLAYS)
    for node in plan.nodes:
        assert node.status == "changed"
        assert "common" in node.sections
        assert "node" not in node.sections and "bmc" not in node.sections
    assert plan.targets == ["head01", "node01", "node02"]
    assert not plan.cluster_files_change  # the timezone is not in a cluster-wide file


def test_adding_a_node_leaves_others_unchanged_but_changes_cluster_files(kit: Any, m: Manifest) -> None:
    state = settled(m)
    data = kit.base()
    data["nodes"][1]["name"] = "node[01-03]"
    bigger = kit.load(data).manifest
    plan = compute(bigger, state, PLAYS)
    assert [(n.name, n.status) for n in plan.nodes] == [
        ("head01", "unchanged"),
        ("node01", "unchanged"),
        ("node02", "unchanged"),
        ("node03", "new"),
    ]
    assert plan.targets == ["node03"]
    assert plan.cluster_files_change
    nodes = by_name(plan)
    assert nodes["node03"].plays == ["common", "common (files)", "slurm", "slurm (files)"]
    assert nodes["node01"].plays == ["common (files)", "slurm (files)"]  # /etc/hosts gains node03


def test_removed_nodes_are_listed_last_with_their_lifecycle(m: Manifest) -> None:
    state = settled(m)
    state.nodes["zz-old"] = NodeState(lifecycle="installed", fingerprints={"node": "x"})
    state.nodes["aa-old"] = NodeState(lifecycle="configured", fingerprints={"node": "y"})
    plan = compute(m, state, PLAYS)
    assert [(n.name, n.status, n.lifecycle, n.plays) for n in plan.nodes[-2:]] == [
        ("aa-old", "removed", "configured", []),
        ("zz-old", "removed", "installed", []),
    ]
    assert plan.has_changes
    assert "aa-old" not in plan.targets


def test_a_removed_node_is_no_change_and_new_when_it_comes_back(kit: Any, m: Manifest) -> None:
    state = settled(m)
    state.nodes["old01"] = NodeState(lifecycle="removed", removed_at="2026-11-23T05:00:00+00:00")
    plan = compute(m, state, PLAYS)
    assert [(n.name, n.status, n.lifecycle) for n in plan.nodes[-1:]] == [("old01", "removed", "removed")]
    assert not plan.has_changes
    state.nodes["node02"] = NodeState(lifecycle="removed", removed_at="2026-11-23T05:00:00+00:00")
    back = {n.name: n for n in compute(m, state, PLAYS).nodes}["node02"]
    assert (back.status, back.lifecycle, back.heavy) == ("new", "new", True)


def test_bmc_only_change_is_not_heavy(kit: Any, m: Manifest) -> None:
    state = settled(m)
    data = kit.base()
    data["nodes"][0]["bmc"]["address"] = "10.0.1.99"
    plan = compute(kit.load(data).manifest, state, PLAYS)
    head = by_name(plan)["head01"]
    assert (head.status, head.sections, head.heavy) == ("changed", ["bmc"], False)
    assert plan.targets == []
    assert plan.has_changes
    assert head.plays == ["common (files)", "slurm (files)"]
    assert not plan.cluster_files_change


def test_recorded_node_without_fingerprints_is_new(m: Manifest) -> None:
    state = settled(m)
    state.nodes["node02"] = NodeState(lifecycle="installed")
    plan = compute(m, state, PLAYS)
    node02 = by_name(plan)["node02"]
    assert (node02.status, node02.lifecycle, node02.heavy) == ("new", "installed", True)


def test_section_missing_from_an_old_state_counts_as_changed(m: Manifest) -> None:
    state = settled(m)
    del state.nodes["node01"].fingerprints["common"]
    node01 = by_name(compute(m, state, PLAYS))["node01"]
    assert (node01.status, node01.sections) == ("changed", ["common"])


def test_an_area_newer_than_the_state_is_no_change_until_it_has_something_for_the_node(kit: Any) -> None:
    data = kit.base()
    m = kit.load(data).manifest
    state = settled(m)
    for fingerprints in (n.fingerprints for n in state.nodes.values()):
        del fingerprints["people"]  # recorded before the people area existed
    assert {n.status for n in compute(m, state, PLAYS).nodes} == {"unchanged"}
    data["users"] = [{"name": "alice", "uid": 2001}]
    node01 = by_name(compute(kit.load(data).manifest, state, PLAYS))["node01"]
    # slurm too: people bring pam_slurm_adopt to the compute nodes (slurm.ssh_only_with_job)
    assert (node01.status, node01.sections) == ("changed", ["people", "slurm"])
    data["slurm"]["ssh_only_with_job"] = False
    node01 = by_name(compute(kit.load(data).manifest, state, PLAYS))["node01"]
    assert (node01.status, node01.sections) == ("changed", ["people"])


# --------------------------------------------------------------------------- --limit, --full
def test_limit_restricts_targets_and_plays(m: Manifest) -> None:
    plan = compute(m, State(), PLAYS, limit=["node01"])
    nodes = by_name(plan)
    assert plan.targets == ["node01"]
    assert [n.heavy for n in plan.nodes] == [False, True, False]
    assert nodes["node01"].plays == ["common", "common (files)", "slurm", "slurm (files)"]
    assert nodes["head01"].plays == []
    assert nodes["node02"].plays == []
    assert nodes["node02"].status == "new"  # still reported as it is


def test_limit_on_unchanged_node_runs_light_plays_only(m: Manifest) -> None:
    plan = compute(m, settled(m), PLAYS, limit=["head01"])
    assert plan.targets == []
    assert by_name(plan)["head01"].plays == ["common (files)", "slurm (files)"]
    assert by_name(plan)["node01"].plays == []


def test_full_targets_every_node(m: Manifest) -> None:
    plan = compute(m, settled(m), PLAYS, full=True)
    assert plan.targets == ["head01", "node01", "node02"]
    assert [n.status for n in plan.nodes] == ["unchanged"] * 3
    assert by_name(plan)["node02"].plays == ["common", "common (files)", "slurm", "slurm (files)"]


def test_full_with_limit_targets_only_the_limit(m: Manifest) -> None:
    plan = compute(m, settled(m), PLAYS, full=True, limit=["node02"])
    assert plan.targets == ["node02"]


def test_plan_to_json(m: Manifest) -> None:
    data = compute(m, State(), PLAYS, limit=["node01"]).to_json()
    assert set(data) == {"has_changes", "cluster_files_change", "targets", "installs", "formats", "install_only",
                         "upgrades", "nodes"}
    assert data["targets"] == ["node01"]
    assert data["installs"] == []
    assert data["formats"] == ["node01"]  # its scratch disk (tests/conftest.py)
    assert data["install_only"] == []
    assert data["nodes"][1] == {
        "name": "node01",
        "status": "new",
        "sections": sorted(node_sections(m, m.node("node01"))),
        "lifecycle": "new",
        "heavy": True,
        "plays": ["common", "common (files)", "slurm", "slurm (files)"],
        "install": None,  # was "": --json says null for none (issue 27 item 13)
        "formats": ("scratch: formats nvme-SCRATCH where blank (1 disk, xfs at /scratch); "
                    "disks holding data are refused"),
        "install_only": None,  # no management bond
    }


# --------------------------------------------------------------------------- PXE installs
def test_plan_shows_per_node_that_apply_will_pxe_install_and_wipe(kit: Any) -> None:
    """Issue 19 item 17: only `apply --check` used to say it; the plan must, per node."""
    data = kit.base()
    data["nodes"][1].update(install="pxe", install_disks=["nvme-DISK_[1-2]"])
    m2 = kit.load(data).manifest
    plan = compute(m2, State(), PLAYS)
    assert plan.installs == ["node01", "node02"] and plan.has_changes
    nodes = by_name(plan)
    assert nodes["node01"].install == "PXE install: wipes nvme-DISK_1, writes the ubuntu-24.04 image (GPT: ESP + root)"
    assert nodes["node02"].install == "PXE install: wipes nvme-DISK_2, writes the ubuntu-24.04 image (GPT: ESP + root)"
    assert nodes["head01"].install == ""
    # installed nodes are not reinstalled unless named
    st = settled(m2, "installed")
    assert compute(m2, st, PLAYS).installs == []
    again = compute(m2, st, PLAYS, reinstall=["node02"])
    assert again.installs == ["node02"]
    assert by_name(again)["node02"].install.startswith("PXE reinstall: wipes nvme-DISK_2, writes the")
    assert compute(m2, State(), PLAYS, limit=["node02"]).installs == ["node02"]


def test_the_plan_table_lists_installs(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1].update(install="pxe", install_disks=["nvme-DISK_[1-2]"])
    buf = io.StringIO()
    print_plan(Console(file=buf, width=250), compute(kit.load(data).manifest, State(), PLAYS), "testc")
    text = buf.getvalue()
    assert "install (destructive)" in text and "PXE install: wipes nvme-DISK_1" in text
    assert "PXE installs (they wipe the install disks): node01, node02" in text


def test_per_node_disk_ids_fingerprint_as_entries_of_their_own(kit: Any) -> None:
    """A disk's ``per_node`` (issue 28) is spent on expansion: a ranged entry's nodes get the
    fingerprints the same nodes had as entries of their own, and a manifest without it the
    ones it had before the field existed (recorded here: kit.base(storage=True))."""
    base = kit.load(kit.base(storage=True)).manifest
    assert {n.name: node_sections(base, n)["node"] for n in base.nodes} == {
        "head01": "869fcdf52d80cc50", "node01": "9094df7022a3d88a", "node02": "2660ac94977481cf"}
    ranged = kit.base()
    ranged["nodes"][1]["hardware"]["disks"] = [{"per_node": ["nvme-S1", "nvme-S2[1-2]"], "use": "scratch"}]
    separate = kit.base()
    entry = separate["nodes"].pop(1)
    for k, ids in enumerate(["nvme-S1", "nvme-S2[1-2]"]):
        node = copy.deepcopy(entry)
        node["name"] = f"node0{k + 1}"
        for nic in node["interfaces"].values():
            nic["ip"] = nic["ip"][:-2] + str(21 + k)
        node["interfaces"]["management"]["mac"] = f"52:54:00:00:00:{21 + k}"
        node["bmc"]["address"] = f"10.0.1.{21 + k}"
        node["hardware"]["disks"] = [{"id": ids, "use": "scratch"}]
        separate["nodes"].append(node)
    one, two = kit.load(ranged).manifest, kit.load(separate).manifest
    for name in ("node01", "node02"):
        assert node_sections(one, one.node(name)) == node_sections(two, two.node(name))


def test_the_install_intent_is_no_configuration_change(kit: Any) -> None:
    """Marking a configured node install: pxe changes nothing on it (and states recorded
    before the field existed stay unchanged)."""
    data = kit.base()
    data["nodes"][1].update(install_disks=["nvme-DISK_[1-2]"])
    plain = kit.load(data).manifest
    data["nodes"][1]["install"] = "pxe"
    marked = kit.load(data).manifest
    for name in plain.node_names():
        assert node_sections(marked, marked.node(name)) == node_sections(plain, plain.node(name))
    assert not compute(marked, settled(plain), PLAYS).has_changes


# --------------------------------------------------------------------------- a management bond
BOND_WORDS = ("management bond bond0 (active-backup): built only by an install, never by apply on the live "
              "link; where the node runs without it (verify's bond:bond0 fails): ")


def bonded(kit: Any, install: str = "pxe", bond: bool = True) -> dict[str, Any]:
    """node01-02 (installed over PXE or by hand), their management link bond0 (or eno1)."""
    data = kit.base()
    data["nodes"][1].update(install=install, install_disks=["nvme-DISK_[1-2]"])
    if bond:
        data["nodes"][1]["interfaces"]["management"]["interface"] = "bond0"
        data["nodes"][1]["bonds"] = {"bond0": {"mode": "active-backup", "members": ["eno1", "eno2"]}}
    return data  # type: ignore[no-any-return]


def test_plan_says_apply_does_not_build_a_management_bond_added_to_an_installed_node(kit: Any) -> None:
    """Issue 28: only an install builds a management bond; apply leaves the live link as it is.
    Adding the bond to installed nodes, plan says so per node (and in --json); a reinstall
    builds it, so a node being reinstalled gets the install's words instead."""
    before = kit.load(bonded(kit, bond=False)).manifest
    after = kit.load(bonded(kit)).manifest
    plan = compute(after, settled(before, "installed"), PLAYS)
    nodes = by_name(plan)
    assert "node" in nodes["node01"].sections
    words = BOND_WORDS + "provision apply --reinstall NODE"
    assert nodes["node01"].install_only == nodes["node02"].install_only == words
    assert nodes["head01"].install_only == ""  # no bond
    assert plan.install_only == ["node01", "node02"]
    data = plan.to_json()
    assert data["install_only"] == ["node01", "node02"]
    assert [n["install_only"] for n in data["nodes"]] == [None, words, words]
    again = by_name(compute(after, settled(before, "installed"), PLAYS, reinstall=["node02"]))
    assert again["node02"].install.startswith("PXE reinstall") and again["node02"].install_only == ""
    assert again["node01"].install_only.startswith("management bond bond0")
    limited = compute(after, settled(before, "installed"), PLAYS, limit=["node02"])
    assert limited.install_only == ["node02"]  # nodes outside --limit are not run


def test_plan_is_quiet_about_a_bond_the_install_builds_or_that_did_not_change(kit: Any) -> None:
    m = kit.load(bonded(kit)).manifest
    fresh = compute(m, State(), PLAYS)
    assert fresh.installs == ["node01", "node02"] and fresh.install_only == []  # the install builds it
    assert compute(m, settled(m, "configured"), PLAYS).install_only == []  # nothing changed on the nodes
    assert compute(m, settled(m, "configured"), PLAYS, full=True).install_only == []
    data = bonded(kit)
    data["nodes"][1]["interfaces"]["data"]["interface"] = "bond1"  # a data bond: apply builds it
    data["nodes"][1]["interfaces"]["management"]["interface"] = "eno1"
    data["nodes"][1]["bonds"] = {"bond1": {"mode": "802.3ad", "members": ["ens1f0", "ens1f1"]}}
    data_bond = kit.load(data).manifest
    assert compute(data_bond, settled(m, "installed"), PLAYS).install_only == []


def test_plan_says_it_for_a_new_node_installed_by_hand(kit: Any) -> None:
    m = kit.load(bonded(kit, install="manual")).manifest
    plan = compute(m, State(), PLAYS)
    assert plan.installs == [] and plan.install_only == ["node01", "node02"]
    assert by_name(plan)["node01"].install_only == BOND_WORDS + (
        "bond it by hand as its install did, or provision apply --reinstall NODE")
    buf = io.StringIO()
    print_plan(Console(file=buf, width=400), plan, "testc")
    assert f"node[01-02]: {BOND_WORDS}bond it by hand" in buf.getvalue()
    data = bonded(kit, install="manual")
    del data["nodes"][1]["install_disks"]  # cannot be installed over PXE: no reinstall to offer
    plain = compute(kit.load(data).manifest, State(), PLAYS)
    assert by_name(plain)["node02"].install_only == BOND_WORDS + "bond it by hand as its install did"


# --------------------------------------------------------------------------- host patterns
GROUPS = {"gpu": ["g1", "g2", "g3"], "head": ["h"], "storage": ["h", "s1"], "empty": []}
HOSTS = ["h", "s1", "g1", "g2", "g3"]


@pytest.mark.parametrize(
    ("pattern", "targets", "expected"),
    [
        ("all", [], HOSTS),
        ("*", [], HOSTS),
        ("gpu", [], ["g1", "g2", "g3"]),
        ("gpu:head", [], ["h", "g1", "g2", "g3"]),
        ("gpu,head", [], ["h", "g1", "g2", "g3"]),
        ("storage:&head", [], ["h"]),
        ("all:!gpu", [], ["h", "s1"]),
        ("gpu:!g2", [], ["g1", "g3"]),
        ("storage:gpu:&gpu:!g3", [], ["g1", "g2"]),
        ("g2", [], ["g2"]),
        ("unknown", [], []),
        ("empty", [], []),
        (HEAVY, ["g2", "s1"], ["s1", "g2"]),
        (HEAVY, [], []),
        ("gpu:&{{ provision_targets | default('all') }}", ["g2", "h"], ["g2"]),
        ("gpu:&{{provision_targets}}", ["g3"], ["g3"]),
        (" gpu : !g1 ", [], ["g2", "g3"]),
    ],
)
def test_resolve_pattern(pattern: str, targets: list[str], expected: list[str]) -> None:
    assert resolve_pattern(pattern, GROUPS, HOSTS, targets) == expected


def test_play_spec_label_and_heavy() -> None:
    heavy = PlaySpec("zfs - pools on storage nodes", "zfs:&{{ provision_targets | default('all') }}", "storage.yml")
    light = PlaySpec("nfs - exports", "nfs_server", "storage.yml")
    assert heavy.heavy and not light.heavy
    assert heavy.label == "zfs"
    assert light.label == "nfs (files)"


# --------------------------------------------------------------------------- playbooks
def test_load_plays_reads_the_real_site_yml(kit: Any) -> None:
    site = kit.root / "playbooks" / "site.yml"
    plays = load_plays(site)
    assert plays
    assert plays[0].playbook == "common.yml"
    assert plays[0].label.startswith("common")
    assert any(p.heavy for p in plays)
    assert any(not p.heavy for p in plays)
    for play in plays:
        assert (site.parent / play.playbook).is_file()
        assert play.playbook != "site.yml"  # site.yml only imports
        assert play.name.split(" - ")[0].strip(), play.name
        if play.heavy:
            assert "provision_targets" in play.hosts
            assert ":&" in play.hosts


def test_real_plays_against_an_example(kit: Any) -> None:
    plays = load_plays(kit.root / "playbooks" / "site.yml")
    m = kit.load((kit.examples / "llm-200k.yaml").read_text()).manifest
    fresh = compute(m, State(), plays)
    assert fresh.targets == m.node_names()
    assert all(n.plays for n in fresh.nodes)
    quiet = compute(m, settled(m), plays)
    assert quiet.targets == []
    assert all(all(label.endswith("(files)") for label in n.plays) for n in quiet.nodes)


def test_plan_shows_the_rdma_stack_on_a_roce_node(kit: Any) -> None:
    """Issue 28 item 1: a node on a RoCE fabric gets the ofed play (the RDMA stack) like an
    InfiniBand node; one off the fabrics does not."""
    plays = load_plays(kit.root / "playbooks" / "site.yml")
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0"}
    fresh = by_name(compute(kit.load(data).manifest, State(), plays))
    ofed = [p.label for p in plays if p.label.startswith("ofed")]
    assert ofed and ofed[0] in fresh["node01"].plays and ofed[0] in fresh["node02"].plays
    assert ofed[0] not in fresh["head01"].plays


def test_load_plays_follows_imports(tmp_path: Path) -> None:
    (tmp_path / "site.yml").write_text(
        "---\n"
        "- name: A\n  ansible.builtin.import_playbook: a.yml\n"
        "- import_playbook: sub/b.yml\n"
        "- name: direct - play\n  hosts: head\n"
    )
    (tmp_path / "a.yml").write_text('- name: one - heavy\n  hosts: "all:&{{ provision_targets }}"\n  roles: []\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text("- hosts: gpu\n  tasks: []\n")
    plays = load_plays(tmp_path / "site.yml")
    assert plays == [
        PlaySpec("one - heavy", "all:&{{ provision_targets }}", "a.yml"),
        PlaySpec("gpu", "gpu", "b.yml"),
        PlaySpec("direct - play", "head", "site.yml"),
    ]


def test_load_plays_on_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "site.yml").write_text("---\n")
    assert load_plays(tmp_path / "site.yml") == []


def test_fields_added_later_leave_recorded_fingerprints_alone(kit: Any) -> None:
    """A node without rdma_device or bonds (issue 28) or scratch fingerprints as it did before
    those fields existed: its dump without them."""
    data = kit.base()
    del data["nodes"][1]["hardware"]["disks"]
    m = kit.load(data).manifest
    node = m.node("node01")
    before = node.model_dump(mode="json", exclude={"bmc", "install", "install_method", "scratch", "bonds"})
    for iface in before["interfaces"].values():
        del iface["rdma_device"], iface["more"]
    assert node_sections(m, node)["node"] == fingerprint(before)
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0", "rdma_device": "mlx5_0"}
    m = kit.load(data).manifest
    assert node_sections(m, m.node("node01"))["node"] != fingerprint(before)


# --------------------------------------------------------------------------- in-place upgrades
def test_plan_shows_the_slurm_upgrade_in_order_and_apply_records_the_release(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12")  # the OS's Slurm 22.05, applied before the record existed
    old = kit.load(data).manifest
    state = settled(old)
    slurm = old.slurm.model_copy(update={"source": "build", "version": "24.11.6"})
    new = old.model_copy(update={"slurm": slurm})
    plan = compute(new, state, PLAYS)
    assert [(u.area, u.steps) for u in plan.upgrades] == [("slurm", [])]
    assert "22.05 -> 23.11 -> 24.11" in plan.upgrades[0].refusal
    assert plan.to_json()["upgrades"][0]["refusal"] == plan.upgrades[0].refusal
    for ns in state.nodes.values():
        ns.recorded = {"slurm": "23.11"}
    plan = compute(new, state, PLAYS)
    assert plan.upgrades[0].steps[1:] == [
        "slurmctld on head01", "slurmd on node[01-02], a batch at a time, drained first: provision apply --rolling"]
    assert "role does not install built packages yet" in plan.upgrades[0].refusal  # apply keeps off it
    buf = io.StringIO()
    print_plan(Console(file=buf, width=250), plan, "testc")
    assert "slurm upgrade, in this order:\n  1. back up" in buf.getvalue()
    assert "slurm upgrade refused: slurm.source: build is decided" in buf.getvalue()
    assert rolevars.recorded(new, new.head) == {"slurm": "24.11"}
    assert compute(old, settled(old), PLAYS).upgrades == []
