"""Whole-manifest checks of the monitoring area: the servers' selector, receiver names, the
receiver that mails users about their idle jobs, and warnings about a setup that monitors but
tells no one. Run by ``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.monitoring.decide import NODE_EXPORTER_VERSIONS, rdma_mountstats_unreadable, server_names
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.ranges import listed
from provisioner.manifest.select import SelectorError
from provisioner.manifest.source import Source


def check_servers(m: Manifest, src: Source) -> list[Diagnostic]:
    if m.monitoring is None:
        return []
    try:
        names = server_names(m)
    except SelectorError as exc:
        return [src.diag(("monitoring", "nodes"), str(exc))]
    out: list[Diagnostic] = []
    for name in names:
        if m.node(name).has_role("compute"):
            out.append(src.diag(
                ("monitoring", "nodes") if m.monitoring.nodes else ("monitoring",),
                f"{name} is a compute node: Prometheus competes with training jobs there and goes "
                "down with the node it should report; prefer a services node", "warning"))
    return out


def check_receivers(m: Manifest, src: Source) -> list[Diagnostic]:
    if m.monitoring is None:
        return []
    out: list[Diagnostic] = []
    seen: set[str] = set()
    for i, rcv in enumerate(m.monitoring.receivers):
        if rcv.name in seen:
            out.append(src.diag(("monitoring", "receivers", i, "name"), f"receiver {rcv.name!r} is defined twice"))
        seen.add(rcv.name)
    if not m.monitoring.receivers:
        out.append(src.diag(("monitoring",), "no alert receivers: alerts show only in Alertmanager's web "
                            "page; add monitoring.receivers (email or webhook)", "warning"))
    return out


def check_idle_notify(m: Manifest, src: Source) -> list[Diagnostic]:
    """monitoring.gpu_job_idle.notify_users names an e-mail receiver (its server, sender and
    login mail the users); with no user's e-mail address it mails no one, which is said."""
    if m.monitoring is None or m.monitoring.gpu_job_idle.notify_users is None:
        return []
    name = m.monitoring.gpu_job_idle.notify_users
    where = ("monitoring", "gpu_job_idle", "notify_users")
    rcv = next((r for r in m.monitoring.receivers if r.name == name), None)
    if rcv is None:
        known = ", ".join(repr(r.name) for r in m.monitoring.receivers if r.email is not None) or "none"
        return [src.diag(where, f"no receiver is named {name!r} (e-mail receivers: {known})")]
    if rcv.email is None:
        return [src.diag(where, f"receiver {name!r} is a webhook: users are mailed through an e-mail "
                         "receiver's server, sender and login")]
    if not any(u.email for u in m.users):
        return [src.diag(where, "no user in users: has an email: no one is mailed about their idle jobs",
                         "warning")]
    return []


def check_rdma_mountstats(m: Manifest, src: Source) -> list[Diagnostic]:
    """Say where the per-mount NFS series will be missing (the collector stays off there)."""
    if m.monitoring is None:
        return []
    blind: dict[str, list[str]] = {}
    for node in m.nodes:
        if rdma_mountstats_unreadable(m, node):
            blind.setdefault(node.os, []).append(node.name)
    out: list[Diagnostic] = []
    for os_name, names in sorted(blind.items()):
        version = ".".join(map(str, NODE_EXPORTER_VERSIONS[os_name]))
        out.append(src.diag(("monitoring",), (
            f"{os_name}'s node_exporter ({version}) cannot parse the statistics of NFS mounts over RDMA "
            f"(node_exporter 1.7.0 can): its mountstats collector stays off on {listed(names)}, so "
            "per-mount NFS series are missing there (the nfs collector still counts the client's RPCs)"),
            "warning"))
    return out


def check_cost(m: Manifest, src: Source) -> list[Diagnostic]:
    """cost.gpus names GPU models the nodes have (an unknown one is a typo: it prices nothing),
    and a GPU model without a price is named (the usage report shows no cost for it)."""
    if m.cost is None:
        return []
    models = sorted({n.hardware.gpu.model for n in m.nodes if n.hardware.gpu is not None})
    out: list[Diagnostic] = []
    for model in m.cost.gpus:
        if model not in models:
            known = ", ".join(repr(x) for x in models) or "none"
            out.append(src.diag(("cost", "gpus", model), f"no node has GPU model {model!r} (the nodes' "
                                f"hardware.gpu.model: {known})"))
    unpriced = [model for model in models if model not in m.cost.gpus]
    if unpriced:
        out.append(src.diag(("cost", "gpus"), f"no price for GPU model {', '.join(map(repr, unpriced))}: the usage "
                            "report shows no cost for the GPU-hours held there", "warning"))
    return out


CHECKS: tuple[Check, ...] = (check_servers, check_receivers, check_idle_notify, check_rdma_mountstats,
                             check_cost)
