"""Monitoring decisions taken from the manifest alone (pure), plus the receivers' secrets.

Everything Prometheus scrapes and every expectation its alert rules compare against (GPUs per
node, NFS mounts, ZFS pools, InfiniBand ports) is computed here from the manifest, never from
facts of other hosts, so adding a node re-renders the monitoring server's configuration in a
light play. The roles ``prometheus`` and ``alertmanager`` format these structures
(templates/prometheus.yml.j2, expected.rules.yml.j2, alertmanager.yml.j2);
``provisioner.areas.monitoring.rolevars`` hands them over as role variables.

Side effects live only in :func:`prepare_secrets` (the apply step that copies the alert
receivers' secrets from the environment or from files into the state directory, and creates
the Grafana admin password there), so that no secret ever enters the inventory.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.areas.storage.base import StorageError
from provisioner.areas.storage.nfs import mount_proto, mounts_for
from provisioner.errors import ProvisionError
from provisioner.manifest.fields import RDMA_NETWORKS
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.monitoring import AlertReceiver, EmailReceiver, Monitoring
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import select_nodes
from provisioner.manifest.source import PathKey
from provisioner.platforms import PLATFORMS
from provisioner.secretfile import private_file_text
from provisioner.state import StateDir

NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
ALERTMANAGER_CLUSTER_PORT = 9094
GRAFANA_PORT = 3000

SECRETS_SUBDIR = "monitoring"  # under the state directory's secrets/ (mode 0700, files 0600)
GRAFANA_PASSWORD_NAME = "grafana-admin-password"
GRAFANA_PASSWORD_BYTES = 24


# --------------------------------------------------------------------------- cluster shape
def admin_api(m: Manifest) -> bool:
    """Prometheus' admin API: TSDB snapshots, and also deleting series for anyone who reaches
    its port, so on only where the head's backup takes a snapshot (``backup.prometheus``; the
    backup area's checks hold that Prometheus runs on the head)."""
    return m.backup is not None and m.backup.prometheus


def enabled(m: Manifest) -> bool:
    """A manifest without a ``monitoring:`` section monitors nothing (no plays run)."""
    return m.monitoring is not None


# What the node_exporter role installs on every monitored node, the same on Debian 12 and
# Ubuntu 22.04/24.04 (roles/node_exporter/vars/*.yml: __node_exporter_packages and, with
# node_exporter_smart, __node_exporter_smart_packages).
NODE_AGENT_PACKAGES = (
    "prometheus-node-exporter", "prometheus-node-exporter-collectors", "smartmontools", "nvme-cli", "jq",
)


# node_exporter reads /proc/self/mountstats with prometheus/procfs, which before v0.12
# (node_exporter 1.7.0) knows the tcp and udp transports only: one NFS mount over RDMA fails
# the whole mountstats collector on that node (every scrape logs 'invalid NFS protocol "rdma"'
# and no mount keeps its series; found in the VM lab, reproduced against Debian's binary).
# The version each release ships (the platform table):
NODE_EXPORTER_VERSIONS: dict[str, tuple[int, int, int]] = {name: p.node_exporter for name, p in PLATFORMS.items()}
MOUNTSTATS_READS_RDMA_SINCE = (1, 7, 0)


def rdma_mountstats_unreadable(m: Manifest, node: Node) -> bool:
    """The node mounts NFS over RDMA and its OS's node_exporter cannot parse that transport."""
    if NODE_EXPORTER_VERSIONS.get(node.os, MOUNTSTATS_READS_RDMA_SINCE) >= MOUNTSTATS_READS_RDMA_SINCE:
        return False
    try:
        return any(mount_proto(m, mnt, node) == "rdma" for mnt in mounts_for(m, node))
    except StorageError:  # reported by the storage checks
        return False


def collectors_off(m: Manifest, node: Node) -> list[str]:
    """node_exporter collectors this node runs without (role variable
    node_exporter_collectors_off): mountstats where it would only fail (see above); the nfs
    collector still counts the client's RPCs there."""
    if not enabled(m):
        return []
    return ["mountstats"] if rdma_mountstats_unreadable(m, node) else []


def image_packages(m: Manifest) -> tuple[str, ...]:
    """Packages a node OS image built for this manifest carries (``provision image build``):
    the monitoring agent, which every node of a monitored cluster gets, so that a deployed
    node's first apply finds it installed."""
    return NODE_AGENT_PACKAGES if enabled(m) else ()


def _section(m: Manifest) -> Monitoring:
    if m.monitoring is None:
        raise ValueError("the manifest has no monitoring section")
    return m.monitoring


def server_names(m: Manifest) -> list[str]:
    """The monitoring servers: ``monitoring.nodes``, else every ``services`` node, else the head.

    Raises :class:`provisioner.manifest.select.SelectorError` for a selector naming no node
    (reported by the area's checks with its position)."""
    mon = _section(m)
    if mon.nodes:
        return select_nodes(m, mon.nodes)
    services = [n.name for n in m.with_role("services")]
    return services or [m.head.name]


def monitored_nodes(m: Manifest) -> list[Node]:
    """Every node runs node_exporter once monitoring is on."""
    return list(m.nodes) if enabled(m) else []


def target(node: Node) -> dict[str, str]:
    """A scrape target: the node's name (the ``node`` label every alert carries) and its
    management address (no DNS needed on the monitoring server)."""
    return {"name": node.name, "address": str(node.ip)}


def node_targets(m: Manifest) -> list[dict[str, str]]:
    return [target(n) for n in monitored_nodes(m)]


def dcgm_targets(m: Manifest) -> list[dict[str, str]]:
    """GPU nodes scraped on the DCGM exporter's port (only with ``gpu_metrics: dcgm``; the
    nvidia-smi collector writes into node_exporter's textfile directory instead)."""
    if not enabled(m) or _section(m).gpu_metrics != "dcgm":
        return []
    return [target(n) for n in m.nodes if n.hardware.gpu is not None]


def servers(m: Manifest) -> list[dict[str, str]]:
    """The monitoring servers as targets: every Prometheus sends its alerts to every
    Alertmanager (they deduplicate as a cluster) and scrapes them all."""
    return [target(m.node(name)) for name in server_names(m)]


def alertmanager_peers(m: Manifest, node: Node) -> list[str]:
    """The other monitoring servers' Alertmanager cluster addresses ([] for a single server:
    clustering off)."""
    names = server_names(m)
    if node.name not in names or len(names) < 2:
        return []
    return [f"{m.node(n).ip}:{ALERTMANAGER_CLUSTER_PORT}" for n in names if n != node.name]


# --------------------------------------------------------------------------- expectations
def expectations(m: Manifest) -> dict[str, list[Any]]:
    """What the manifest promises, as series the alert rules compare with what nodes report.

    ``gpus``: GPUs per GPU node (GpuMissing); ``nfs_mounts``: NFS mounts mounted at boot
    (NfsMountMissing; automounts are mounted on first access, so they are not expected);
    ``zpools``: pools per storage node (ZfsPoolMissing); ``rdma_ports``: the RDMA ports
    (:func:`rdma_ports`; InfinibandLinkDown, RoceLinkDown, RdmaLinkDegraded).
    """
    if not enabled(m):
        return {"gpus": [], "nfs_mounts": [], "zpools": [], "rdma_ports": []}
    gpus = [{"node": n.name, "count": n.gpu_count} for n in m.nodes if n.gpu_count]
    mounts: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for mnt in m.nfs.mounts:
        if mnt.automount:
            continue
        for name in select_nodes(m, mnt.nodes):
            if (name, mnt.path) not in seen:
                seen.add((name, mnt.path))
                mounts.append({"node": name, "mountpoint": mnt.path})
    order = {name: i for i, name in enumerate(m.node_names())}
    mounts.sort(key=lambda e: (order[e["node"]], e["mountpoint"]))
    zpools = [{"node": p.node, "zpool": p.name} for p in m.zfs.pools]
    return {"gpus": gpus, "nfs_mounts": mounts, "zpools": zpools, "rdma_ports": rdma_ports(m)}


def rdma_ports(m: Manifest) -> list[dict[str, str]]:
    """The RDMA ports the manifest promises, ``{node, fabric, device}``: one per NIC on the
    infiniband network, and on the roce network where it runs RDMA (``rdma: false``: a plain
    Ethernet link, no RDMA device to watch). ``device`` is the NIC's ``rdma_device``; NICs
    without one collapse into one entry per node and fabric with ``device: ""``, met by any
    active port of the node that no named NIC claims. node_exporter's infiniband collector
    lists InfiniBand and RoCE ports alike (/sys/class/infiniband, state ACTIVE = 4), so the
    fabric comes from here, never from the port."""
    out: list[dict[str, str]] = []
    for node in m.nodes:
        for fabric in RDMA_NETWORKS:
            network = m.networks.named(fabric)
            iface = node.interfaces.get(fabric)
            if iface is None or network is None or (fabric == "roce" and not getattr(network, "rdma", True)):
                continue
            devices = dict.fromkeys(nic.rdma_device or "" for nic in iface.nics())
            out += [{"node": node.name, "fabric": fabric, "device": device} for device in devices]
    return out


# --------------------------------------------------------------------------- receivers' secrets
@dataclass(frozen=True)
class SecretRef:
    """One secret a receiver needs: where the manifest says it is, and the file name it gets
    in the state directory (``secrets/monitoring/<key>``)."""

    receiver: str
    field: str  # auth_password, url, bearer_token
    env: str | None
    file: str | None
    path: PathKey  # the manifest field, for messages

    @property
    def key(self) -> str:
        return f"{self.receiver}.{self.field}"

    @property
    def origin(self) -> str:
        return f"environment variable {self.env}" if self.env is not None else f"file {self.file}"


def _refs_of(i: int, rcv: AlertReceiver) -> list[SecretRef]:
    base: PathKey = ("monitoring", "receivers", i)
    out: list[SecretRef] = []
    if rcv.email is not None:
        e = rcv.email
        if e.auth_password_env is not None or e.auth_password_file is not None:
            out.append(SecretRef(rcv.name, "auth_password", e.auth_password_env, e.auth_password_file,
                                 (*base, "email")))
    if rcv.webhook is not None:
        w = rcv.webhook
        if w.url_env is not None or w.url_file is not None:
            out.append(SecretRef(rcv.name, "url", w.url_env, w.url_file, (*base, "webhook")))
        if w.bearer_token_env is not None or w.bearer_token_file is not None:
            out.append(SecretRef(rcv.name, "bearer_token", w.bearer_token_env, w.bearer_token_file,
                                 (*base, "webhook")))
    return out


def secret_refs(m: Manifest) -> list[SecretRef]:
    if m.monitoring is None:
        return []
    return [ref for i, rcv in enumerate(m.monitoring.receivers) for ref in _refs_of(i, rcv)]


def secret_env_names(m: Manifest) -> set[str]:
    """Environment variables holding receiver secrets (kept out of what ansible-runner records)."""
    return {ref.env for ref in secret_refs(m) if ref.env is not None}


def secret_file_var(key: str) -> str:
    """The role variable's value for a secret: a path on the control machine, never the value."""
    return "{{ provision_state_dir }}/secrets/" + f"{SECRETS_SUBDIR}/{key}"


def _email_vars(receiver: str, e: EmailReceiver, to: list[str]) -> dict[str, Any]:
    """One e-mail configuration of ``alertmanager_receivers``: the server, sender and login of
    the manifest's receiver ``receiver``, its password as the path of that receiver's secret."""
    email: dict[str, Any] = {"to": to, "sender": e.sender, "smarthost": e.smarthost, "require_tls": e.require_tls}
    if e.auth_username:
        email["auth_username"] = e.auth_username
    if e.auth_password_env is not None or e.auth_password_file is not None:
        email["auth_password_file"] = secret_file_var(f"{receiver}.auth_password")
    return email


def receiver_vars(m: Manifest) -> list[dict[str, Any]]:
    """``alertmanager_receivers``: what alertmanager.yml.j2 needs, secrets as file paths on the
    control machine (the role reads them there, in tasks that log nothing). Settings that are
    not used are left out. The manifest's receivers, routed by severity, then the users'
    (:func:`user_receiver_vars`)."""
    if m.monitoring is None:
        return []
    out: list[dict[str, Any]] = []
    for rcv in m.monitoring.receivers:
        entry: dict[str, Any] = {"name": rcv.name, "severities": list(rcv.severities)}
        if rcv.email is not None:
            entry["email"] = _email_vars(rcv.name, rcv.email, list(rcv.email.to))
        if rcv.webhook is not None:
            w = rcv.webhook
            webhook: dict[str, Any] = (
                {"url": w.url} if w.url is not None else {"url_file": secret_file_var(f"{rcv.name}.url")}
            )
            if w.bearer_token_env is not None or w.bearer_token_file is not None:
                webhook["bearer_token_file"] = secret_file_var(f"{rcv.name}.bearer_token")
            entry["webhook"] = webhook
        out.append(entry)
    return out + user_receiver_vars(m)


# --------------------------------------------------------------------------- idle GPUs
IDLE_ALERT = "GpuJobIdle"  # roles/prometheus/templates/provision-alerts.yml.j2
# Alertmanager receivers of the users: a prefix no manifest receiver name can have (they
# start with a letter), so the two never collide.
USER_RECEIVER_PREFIX = "_user-"


def idle_percent(m: Manifest) -> int | float:
    """``prometheus_alert_idle_gpu_percent``: monitoring.gpu_job_idle.utilization_below in
    percent, whole where it is (5, not 5.000000000000001 or 5.0: the alert's text shows it)."""
    percent = round(_section(m).gpu_job_idle.utilization_below * 100, 6)
    return int(percent) if percent.is_integer() else percent


def notify_receiver(m: Manifest) -> AlertReceiver | None:
    """The e-mail receiver whose server, sender and login mail the users about their idle
    jobs (monitoring.gpu_job_idle.notify_users); None when users get no mail or the name is
    not an e-mail receiver (the area's checks report that)."""
    if m.monitoring is None or m.monitoring.gpu_job_idle.notify_users is None:
        return None
    name = m.monitoring.gpu_job_idle.notify_users
    return next((r for r in m.monitoring.receivers if r.name == name and r.email is not None), None)


def user_receiver_vars(m: Manifest) -> list[dict[str, Any]]:
    """One receiver per user with an e-mail address, when monitoring.gpu_job_idle.notify_users
    names an e-mail receiver: routed on the alert's ``user`` label (GpuJobIdle only), mailed
    through that receiver's server with its sender and login (its password by reference, as
    the receiver has it). Users without an address get nothing; the operators' routes are
    unchanged (every route continues), so they still get the alert too."""
    rcv = notify_receiver(m)
    if rcv is None or rcv.email is None:
        return []
    return [
        {"name": f"{USER_RECEIVER_PREFIX}{u.name}",
         "matchers": [f'alertname="{IDLE_ALERT}"', f'user="{u.name}"'],
         "email": _email_vars(rcv.name, rcv.email, [u.email])}
        for u in m.users if u.email is not None
    ]


def read_secret(ref: SecretRef, environ: Mapping[str, str] | None = None) -> str:
    """The secret's value. A variable must be set and non-empty; a file must be a regular
    file that others cannot read (like SSH private keys); one trailing newline is dropped.
    Messages name the manifest field and where the value was looked for, never the value."""
    where = ".".join(str(p) for p in ref.path)
    if ref.env is not None:
        env = os.environ if environ is None else environ
        value = env.get(ref.env, "")
        if not value:
            raise ProvisionError(f"{where}: receiver {ref.receiver!r} needs its {ref.field}: "
                                 f"environment variable {ref.env} is empty or unset")
        return value
    assert ref.file is not None  # the model guarantees one of the two
    return private_file_text(Path(ref.file), where, f"the {ref.field} of receiver {ref.receiver!r}", one_line=True)


def _write_private(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` with mode 0600, atomically; unchanged content is left alone."""
    try:
        if path.read_text(encoding="utf-8") == value:
            os.chmod(path, 0o600)
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            data = value.encode()
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:  # a full disk: no half-written secret stays, and the message says where
        tmp.unlink(missing_ok=True)
        if exc.errno is not None:
            exc.filename = exc.filename or str(path)
        raise


def prepare_secrets(loaded: Loaded, state: StateDir) -> None:
    """The monitoring area's ``prepare`` step (provisioner.areas.registry), before an apply:
    every receiver secret is read from its variable or file into ``secrets/monitoring/``
    (0600, in the 0700 secrets directory) where the alertmanager role finds it, secrets of
    receivers no longer in the manifest are removed, and the Grafana admin password is
    created once (kept across runs: it is the password of an existing Grafana)."""
    m = loaded.manifest
    if m.monitoring is None:
        return
    values = {ref.key: read_secret(ref) for ref in secret_refs(m)}  # all read before anything is written
    folder = state.secrets / SECRETS_SUBDIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for key, value in values.items():
        _write_private(folder / key, value)
    keep = set(values) | {GRAFANA_PASSWORD_NAME}
    for old in folder.iterdir():
        if old.is_file() and old.name not in keep and not old.name.startswith("."):
            old.unlink()
    grafana = folder / GRAFANA_PASSWORD_NAME
    if m.monitoring.grafana and not grafana.exists():
        _write_private(grafana, secrets.token_urlsafe(GRAFANA_PASSWORD_BYTES))


def secret_values(state: StateDir) -> list[str]:
    """The secrets prepared for this cluster, for the artifact scan of ``provision apply``."""
    folder = state.secrets / SECRETS_SUBDIR
    if not folder.is_dir():
        return []
    out: list[str] = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            try:
                out.append(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                continue
    return out
