"""The Slurm area's verify checks, asked on the controller: a compute node's state and GRES,
GPU device fencing (a one-GPU job), and NCCL between two nodes through ``srun --mpi=pmix``;
on a compute node itself, that sshd's PAM stack lets only users with a job there in
(pam_slurm_adopt)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from provisioner.areas.fabric.decide import shared_rdma_network
from provisioner.areas.gpu.verify import ALL_REDUCE_MPI_GLOB, allreduce_verdict
from provisioner.areas.slurm import adopt
from provisioner.areas.slurm import decide as slurm
from provisioner.areas.slurm.releases import cgroup_plan, cgroups_usable
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck import parsers
from provisioner.nodecheck.check import (
    Check,
    CheckList,
    Judge,
    NodeChecks,
    Outcome,
    Output,
    Ring,
    judged,
    run_first,
    stderr_hint,
)
from provisioner.nodecheck.parsers import ParseError

Fabric = Literal["infiniband", "roce", "ethernet"]

GOOD_SLURM_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
BAD_SLURM_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "DOWN", "NOT_RESPONDING", "FAIL", "FAILING",
                             "INVALID", "INVALID_REG", "MAINTENANCE", "REBOOT_REQUESTED", "UNKNOWN"})
# all_reduce_perf bus bandwidth floors, GB/s, between two nodes (one rank each, all their GPUs):
# NCCL over InfiniBand/RoCE (rdma) or over TCP sockets (ethernet). Conservative against healthy
# links (HDR/NDR ports ~20-45 GB/s, 25-100 GbE sockets ~2-10): "not broken", not "fast".
MULTI_NODE_FLOORS: dict[Fabric, float] = {"infiniband": 5.0, "roce": 5.0, "ethernet": 0.5}
MULTI_NODE_WAIT_S = 60  # how long the two-node job waits for its GPUs (srun --immediate)
FENCE_WAIT_S = 30  # how long the fencing job waits for a free GPU (srun --immediate)


# --------------------------------------------------------------------------- parsers
@dataclass(frozen=True)
class SlurmNode:
    state: str  # e.g. IDLE, MIXED, ALLOCATED, DOWN+NOT_RESPONDING, IDLE+DRAIN
    gres: str  # e.g. gpu:rtx_a6000:2, "(null)"
    reason: str = ""


def parse_scontrol_node(text: str) -> SlurmNode:
    """``scontrol show node NAME --oneliner``."""
    state = re.search(r"\bState=(\S+)", text)
    if not state:
        raise ParseError("no State= in scontrol's answer")
    gres = re.search(r"\bGres=(\S+)", text)
    reason = re.search(r"\bReason=(.*?)(?= [A-Za-z]+=|$)", text.strip())
    return SlurmNode(state.group(1), gres.group(1) if gres else "(null)", reason.group(1) if reason else "")


# The PAM files sshd's stack is made of on Debian and Ubuntu, the module's file (Debian 12 puts it
# in /lib/security, later releases under the multiarch directory) and slurm.conf's PrologFlags
PAM_FILES = ("sshd", "common-account", "common-session-noninteractive", "common-session")
ADOPT_COMMAND = (
    "for f in " + " ".join(PAM_FILES) + "; do echo \"==> $f\"; cat /etc/pam.d/$f 2>/dev/null; done; "
    "echo '==> module'; ls /lib/security/pam_slurm_adopt.so /lib/*/security/pam_slurm_adopt.so "
    "/usr/lib/*/security/pam_slurm_adopt.so 2>/dev/null; "
    "echo '==> prologflags'; scontrol show config 2>/dev/null | grep -i '^PrologFlags'; true"
)


@dataclass(frozen=True)
class PamRule:
    kind: str  # account, session, ... (a leading "-": skip when the module is missing)
    control: str  # required, sufficient, [success=1 default=ignore], ...
    module: str  # pam_unix.so
    args: str = ""


def parse_sections(text: str) -> dict[str, list[str]]:
    """``==> NAME`` headed sections (the command above) -> their lines, comments and blank
    lines left out (PAM ends a line at its ``#``)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        if raw.startswith("==> "):
            current = sections.setdefault(raw[4:].strip(), [])
            continue
        line = raw.split("#", 1)[0].strip()
        if line and current is not None:
            current.append(line)
    if "sshd" not in sections:
        raise ParseError("no /etc/pam.d/sshd section in the answer")
    return sections


_RULE = re.compile(r"^(?P<kind>-?\w+)\s+(?P<control>\[[^\]]*\]|\S+)\s+(?P<module>\S+)\s*(?P<args>.*)$")


def pam_stack(files: dict[str, list[str]], name: str, depth: int = 0) -> list[PamRule]:
    """The rules of PAM service ``name`` in order, Debian's ``@include FILE`` and
    ``TYPE include FILE`` lines expanded from ``files`` (a missing file adds nothing)."""
    if depth > 8:
        raise ParseError(f"/etc/pam.d includes nest too deep at {name}")
    out: list[PamRule] = []
    for line in files.get(name, []):
        if line.startswith("@include"):
            out += pam_stack(files, line.split(maxsplit=1)[1].strip(), depth + 1)
            continue
        m = _RULE.match(line)
        if not m:
            raise ParseError(f"not a PAM rule in /etc/pam.d/{name}: {line!r}")
        if m.group("control") in ("include", "substack"):
            out += [r for r in pam_stack(files, m.group("module"), depth + 1)
                    if r.kind.lstrip("-") == m.group("kind").lstrip("-")]
            continue
        out.append(PamRule(m.group("kind"), m.group("control"), m.group("module").rsplit("/", 1)[-1],
                           m.group("args").strip()))
    return out


def adopt_verdict(sections: dict[str, list[str]]) -> Outcome:
    """sshd's account stack ends with pam_access (sufficient, its own rules file), then
    pam_slurm_adopt (required: a missing module refuses, never lets everyone in); its session
    stack has no pam_systemd; the module is installed; slurm.conf has PrologFlags=Contain."""
    stack = pam_stack(sections, "sshd")
    account = [r for r in stack if r.kind.lstrip("-") == "account"]
    tail = [(r.module, r.control) for r in account[-2:]]
    wrong: list[str] = []
    if tail != [("pam_access.so", "sufficient"), ("pam_slurm_adopt.so", "required")]:
        shown = ", ".join(f"{r.control} {r.module}" for r in account[-2:]) or "nothing"
        wrong.append(f"sshd's account stack ends with {shown}, not sufficient pam_access.so then "
                     "required pam_slurm_adopt.so")
    elif "accessfile=" not in account[-2].args:
        wrong.append("sshd's pam_access.so has no accessfile= (the admins' rules)")
    if any(r.module == "pam_systemd.so" for r in stack if r.kind.lstrip("-") == "session"):
        wrong.append("pam_systemd.so is in sshd's session stack: it moves adopted sessions out of the job's cgroup")
    if not sections.get("module"):
        wrong.append("pam_slurm_adopt.so is not installed")
    flags = " ".join(sections.get("prologflags", []))
    if "contain" not in flags.lower():
        wrong.append(f"slurm.conf has no PrologFlags=Contain ({flags or 'no PrologFlags'}): no extern step "
                     "to adopt into")
    if wrong:
        return Outcome("FAIL", "; ".join(wrong))
    return Outcome("PASS", "SSH: admins (pam_access), then only users with a job here (pam_slurm_adopt)")


# --------------------------------------------------------------------------- verdicts
def slurm_verdict(expected_gres: str, drained_by: str = "") -> Callable[[SlurmNode], Outcome]:
    """``drained_by``: a drain whose reason starts with it is expected (``apply --rolling``
    verifies a node it drained itself before resuming it); any other drain, and every other
    bad flag, still fails."""
    def verdict(n: SlurmNode) -> Outcome:
        flags = set(n.state.split("+"))
        base = n.state.split("+")[0]
        ours = bool(drained_by) and n.reason.startswith(drained_by)
        bad = sorted(flags & BAD_SLURM_FLAGS - ({"DRAIN"} if ours else set()))
        if bad or base not in GOOD_SLURM_STATES:
            why = f" ({n.reason})" if n.reason else ""
            return Outcome("FAIL", f"state {n.state}{why}")
        if expected_gres and expected_gres not in n.gres.split(","):
            return Outcome("FAIL", f"Gres {n.gres}, manifest says {expected_gres}")
        note = f" ({drained_by}: resumed after verify)" if ours and "DRAIN" in flags else ""
        return Outcome("PASS", f"{n.state}{note}" + (f", {n.gres}" if expected_gres else ""))
    return verdict


def srun_refusal(out: Output, busy: str, job: str) -> Outcome | None:
    """The outcome of an ``srun --immediate`` job that did not run to its end (None when it
    did): refused at once because its GPUs are held (``busy``: SKIP), or any other failure."""
    if out.error:
        return Outcome("FAIL", out.error)
    if out.rc != 0 and "Immediate execution impossible" in out.stdout + out.stderr:
        return Outcome("SKIP", busy)
    if out.rc != 0:
        return Outcome("FAIL", f"{job} did not run{stderr_hint(out)}")
    return None


def fenced_verdict(node: str, total: int) -> Judge:
    """A one-GPU job on ``node`` (``nvidia-smi -L`` under ``srun --gres=gpu:1``) must see
    exactly one of its ``total`` GPUs; a node with every GPU taken is not checked."""
    def judge(out: Output) -> Outcome:
        refused = srun_refusal(out, f"no GPU of {node} was free within {FENCE_WAIT_S} s (jobs hold them)", "the job")
        if refused is not None:
            return refused
        seen = len(re.findall(r"^GPU \d+:", out.stdout, re.M))
        if seen == 1:
            return Outcome("PASS", f"a --gres=gpu:1 job sees 1 of {total} GPUs")
        if seen == 0:
            return Outcome("FAIL", "a --gres=gpu:1 job sees no GPU")
        return Outcome("FAIL", f"a --gres=gpu:1 job sees {seen} of {total} GPUs: devices are not fenced "
                               "(cgroup.conf ConstrainDevices)")
    return judge


def multi_node_verdict(pair: str, fabric: Fabric, floor: float) -> Judge:
    """all_reduce_perf across ``pair`` through srun: a job that cannot start at once (GPUs
    held by jobs) is not checked; any other refusal or failure fails."""
    summary = judged(parsers.parse_all_reduce, allreduce_verdict(f"{fabric} between {pair}", floor))

    def judge(out: Output) -> Outcome:
        busy = f"the GPUs of {pair} were not free within {MULTI_NODE_WAIT_S} s (jobs hold them)"
        return srun_refusal(out, busy, "the two-node job") or summary(out)
    return judge


def multi_node_floor(m: Manifest, a: Node, b: Node) -> tuple[Fabric, float]:
    """NCCL between ``a`` and ``b`` goes over RDMA where both sit on an RDMA fabric
    (InfiniBand first, then RoCE), else over TCP sockets. A floor the manifest gives for that
    fabric, else its ``rdma`` floor (both RDMA fabrics), else the default."""
    net = shared_rdma_network(m, a, b)
    fabric: Fabric = "ethernet" if net is None else ("infiniband" if net == "infiniband" else "roce")
    floors = m.verify.multi_node_busbw_floor_gbps
    if fabric != "ethernet" and fabric not in floors and "rdma" in floors:
        return fabric, floors["rdma"]
    return fabric, floors.get(fabric, MULTI_NODE_FLOORS[fabric])


def multi_node_command(a: str, b: str, gpus: int) -> str:
    """One rank per node, each driving ``gpus`` GPUs, started by Slurm's PMIx (the MPI build
    of all_reduce_perf)."""
    return (f"srun -w {shlex.quote(a)},{shlex.quote(b)} -N 2 --ntasks-per-node=1 --gres=gpu:{gpus} --mpi=pmix "
            f"-t 5 --immediate={MULTI_NODE_WAIT_S} " + run_first(ALL_REDUCE_MPI_GLOB, f"-b 8 -e 256M -f 2 -g {gpus}"))


def unfenced_cluster(m: Manifest) -> str:
    """Why this cluster's Slurm does not fence GPU devices at all ("" when it does); the same
    for every node, so it is decided once per manifest (it looks at every slurmd node)."""
    if cgroup_plan(m).constrain_devices:
        return ""
    if not cgroups_usable(m):
        return "this cluster's Slurm cannot fence devices (a slurmd node's Slurm has no cgroup v2; validate warns)"
    return "slurm.constrain_devices is off in the manifest"


def fencing_skip(gpus: int, drained_by: str, unfenced: str) -> str:
    """Why the GPU fencing job is not run on a node ("" when it is); ``unfenced``: see
    :func:`unfenced_cluster`."""
    if gpus < 2:
        return "one GPU: nothing to fence a job from"
    if drained_by:
        return f"drained by {drained_by}: no job starts there until it is resumed"
    return unfenced


def gpu_job_checks(m: Manifest, node: Node, drained_by: str, unfenced: str, ring: Ring, out: CheckList) -> None:
    """A GPU compute node's jobs: ``slurm.gpu_fence`` and ``nccl.multi_node`` with the next
    GPU compute node (a ring), both started from the controller."""
    hw = node.hardware.gpu
    assert hw is not None
    t, name = m.verify.command_timeout, node.name
    why = fencing_skip(hw.count, drained_by, unfenced)
    if why:
        out.skip("slurm.gpu_fence", why)
    else:
        out.add("slurm.gpu_fence", f"srun -w {shlex.quote(name)} -N 1 -n 1 --gres=gpu:1 -t 2 "
                f"--immediate={FENCE_WAIT_S} nvidia-smi -L", fenced_verdict(name, hw.count), "gpu",
                host=m.head.name, timeout=max(t, FENCE_WAIT_S + 60))
    peer = ring.peer(node)
    if peer is None:
        out.skip("nccl.multi_node", "no other GPU compute node to pair with")
    elif drained_by:
        out.skip("nccl.multi_node", f"drained by {drained_by}: no job starts there until it is resumed")
    else:
        assert peer.hardware.gpu is not None
        gpus = min(hw.count, peer.hardware.gpu.count)
        fabric, floor = multi_node_floor(m, node, peer)
        out.add("nccl.multi_node", multi_node_command(name, peer.name, gpus),
                multi_node_verdict(f"{name} and {peer.name}", fabric, floor), "gpu", host=m.head.name,
                timeout=max(t, MULTI_NODE_WAIT_S + 360))


def checks(m: Manifest) -> NodeChecks:
    if not m.slurm.enabled:
        return lambda node, drained_by: []
    unfenced = unfenced_cluster(m)
    gpu_ring = Ring([n for n in slurm.slurm_nodes(m) if n.hardware.gpu is not None])

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        if not node.has_role("compute"):
            return out.checks
        hw = node.hardware.gpu
        gres = f"gpu:{hw.gres_type}:{hw.count}" if hw is not None else ""
        out.add("slurm.node", f"scontrol show node {shlex.quote(node.name)} --oneliner",
                judged(parse_scontrol_node, slurm_verdict(gres, drained_by)), host=m.head.name)
        if adopt.is_adopt_node(m, node):
            out.add("slurm.ssh_adopt", ADOPT_COMMAND, judged(parse_sections, adopt_verdict))
        if hw is not None:
            gpu_job_checks(m, node, drained_by, unfenced, gpu_ring, out)
        return out.checks

    return node_checks
