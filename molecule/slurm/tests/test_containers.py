"""Verify containers in Slurm jobs: enroot 4.1.2 and pyxis 0.24.0 built by the role
`containers` from the pinned upstream sources (../shared/vendor, mounted at /opt/vendor),
real jobs submitted by alice with `srun --container-image=...`.

No registry is reachable here: the image is a squashfs file (enroot's image format, made
with enroot's own squashfs options from a busybox root file system), which pyxis turns
into the job's container (`enroot create`) and runs as the submitting user. Submitted on
slurm-gpu01 (a compute node: srun needs the pyxis plugin for --container-image, and the
head is neither a compute nor a login node).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from slurmkit import node

testinfra_hosts = ["ansible://slurm-gpu01"]

COMPUTE = ["slurm-gpu01", "slurm-gpu02", "slurm-gpu03"]
IMAGE = "/opt/images/busybox.sqsh"
IMAGE_ID = "provision-test-image"
ALICE_UID, ALICE_GID = 2001, 3000
SLURMD_SPOOL = "/var/lib/slurm/slurmd"  # the slurm role's slurm_slurmd_spool_dir
CAROL_UID = 2003  # her own group, not vision
REGISTRY_CREDENTIALS = "/etc/enroot/site/.credentials"  # the role's containers_site_config_path


@pytest.fixture(scope="module", autouse=True)
def image_and_home() -> None:
    """On every compute node: the squashfs image, and alice's home (on a real cluster the
    NFS mount; kernel NFS cannot mount in these containers), which enroot mounts."""
    script = (
        "set -e; rm -rf /tmp/img-root; mkdir -p /tmp/img-root/bin /tmp/img-root/etc /opt/images; "
        "cp /bin/busybox /tmp/img-root/bin/; "
        "for a in sh ls cat id hostname echo grep; do ln -sf busybox /tmp/img-root/bin/$a; done; "
        f"echo {IMAGE_ID} > /tmp/img-root/etc/image-id; "
        f"mksquashfs /tmp/img-root {IMAGE} -comp lzo -noD -all-root -noappend -quiet; chmod 0644 {IMAGE}; "
        f"install -d -o {ALICE_UID} -g {ALICE_GID} -m 0700 /home/alice"
    )
    for name in COMPUTE:
        node(name).check_output("timeout 60 sh -c " + shlex.quote(script))


def as_alice(host: Any, command: str) -> str:
    out: str = host.check_output(f"timeout 120 runuser -u alice -- sh -c {shlex.quote('cd /tmp && ' + command)}")
    return out


def test_pyxis_built_against_this_nodes_slurm(host: Any) -> None:
    slurm = host.check_output("dpkg-query -W -f='${Version}' slurm-client")
    assert host.file(f"/usr/local/src/provision-containers/pyxis-0.24.0-slurm-{slurm}/spank_pyxis.so").exists
    conf = host.file("/etc/slurm/plugstack.conf.d/pyxis.conf").content_string
    assert "required /usr/local/lib/slurm/spank_pyxis.so" in conf
    assert "--container-image" in host.check_output("srun --help")
    assert host.check_output("enroot version") == "4.1.2"


def test_one_gpu_container_job_runs_in_the_image_as_alice_with_exactly_its_gpu(host: Any) -> None:
    out = as_alice(host, f"srun --time=2 -w slurm-gpu02 --gres=gpu:1 --container-image={IMAGE} "
                         "sh -c 'cat /etc/image-id; id -u; echo gpus=$SLURM_STEP_GPUS; ls /dev'")
    lines = out.split()
    assert lines[0] == IMAGE_ID and lines[1] == str(ALICE_UID), out
    step_gpus = next(w for w in lines if w.startswith("gpus=")).removeprefix("gpus=")
    assert re.fullmatch(r"[01]", step_gpus), out
    gpus = sorted(w for w in lines if re.fullmatch(r"nvidia\d+", w))
    assert gpus == [f"nvidia{step_gpus}"], out  # its one GPU, not the node's other one


def test_two_gpu_container_job_on_the_added_node_sees_both(host: Any) -> None:
    out = as_alice(host, f"srun --time=2 -w slurm-gpu03 --gres=gpu:2 --container-image={IMAGE} ls /dev")
    assert sorted(w for w in out.split() if re.fullmatch(r"nvidia\d+", w)) == ["nvidia0", "nvidia1"], out


def test_container_job_without_gpus_sees_none(host: Any) -> None:
    out = as_alice(host, f"srun --time=2 -w slurm-gpu02 --container-image={IMAGE} ls /dev")
    assert [w for w in out.split() if w.startswith("nvidia")] == [], out


def test_two_node_container_job_through_pmix(host: Any) -> None:
    out = as_alice(host, f"srun --time=2 --mpi=pmix -N2 -n2 -w slurm-gpu02,slurm-gpu03 -l "
                         f"--container-image={IMAGE} "
                         "sh -c 'echo $(hostname) $(cat /etc/image-id) rank=$PMIX_RANK "
                         "uri=${PMIX_SERVER_URI41:-$PMIX_SERVER_URI4} "
                         f"server=$(ls -d {SLURMD_SPOOL}/pmix.$SLURM_JOB_ID.$SLURM_STEP_ID)'")
    rows = sorted(line.split(": ", 1)[1].split() for line in out.splitlines() if ": " in line)
    assert [r[:3] for r in rows] == [["slurm-gpu02", IMAGE_ID, "rank=0"], ["slurm-gpu03", IMAGE_ID, "rank=1"]], out
    assert all(len(r) == 5 and len(r[3]) > len("uri=") for r in rows), out
    # enroot's 50-slurm-pmi.sh mounted the step's PMIx server directory into each container
    assert all(re.fullmatch(rf"server={SLURMD_SPOOL}/pmix\.\d+\.\d+", r[4]) for r in rows), out


def test_enroot_keeps_alices_containers_in_her_own_private_directory() -> None:
    data = node("slurm-gpu02").file(f"/var/lib/enroot/data/user-{ALICE_UID}")
    assert data.is_directory and data.uid == ALICE_UID and data.mode == 0o700
    assert node("slurm-gpu02").file("/var/lib/enroot/data").mode == 0o1777


# A registry that asks for a Basic login and answers the manifest request with a digest made
# from the Authorization header it got: `enroot digest` prints what enroot sent.
STUB_REGISTRY = """
import hashlib, http.server, sys
class Registry(http.server.BaseHTTPRequestHandler):
    def answer(self):
        auth = self.headers.get("Authorization")
        self.send_response(401 if auth is None else 200)
        if auth is None:
            self.send_header("WWW-Authenticate", 'Basic realm="stub"')
        else:
            self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(auth.encode()).hexdigest())
        self.send_header("Content-Length", "0")
        self.end_headers()
    do_HEAD = do_GET = answer
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Registry).serve_forever()
"""


def test_the_site_registry_login_is_where_enroot_reads_it_for_its_group_only() -> None:
    """slurm.containers.registry_logins (token from SLURMTEST_REGISTRY_TOKEN, prepared in the
    scenario's state directory): enroot's .credentials in the site folder, root's and readable
    by the group vision alone, enroot pointed there; alice (vision) reads it, carol not; and
    enroot run by alice logs in to a (stub) registry with it."""
    kept = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "state" / "secrets" / "enroot-credentials"
    token = kept.read_text().split()[5]
    for name in ("slurm-gpu01", "slurm-gpu03"):
        creds = node(name).file(REGISTRY_CREDENTIALS)
        assert (creds.user, creds.group, creds.mode) == ("root", "vision", 0o640), name
        assert creds.content_string == f"machine localhost login ci-robot password {token}\n", name
        dropin = node(name).file("/etc/enroot/enroot.conf.d/provision-registry.conf").content_string
        assert "\nENROOT_CONFIG_PATH /etc/enroot/site\n" in dropin, name
    gpu01 = node("slurm-gpu01")
    carol = gpu01.run(f"timeout 10 setpriv --reuid={CAROL_UID} --regid={CAROL_UID} --clear-groups "
                      f"cat {REGISTRY_CREDENTIALS}")
    assert carol.rc != 0 and "Permission denied" in carol.stderr
    gpu01.check_output(f"printf %s {shlex.quote(STUB_REGISTRY)} > /tmp/stub_registry.py")
    script = ("timeout 60 python3 /tmp/stub_registry.py 5005 >/dev/null 2>&1 & "
              "for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:5005/ && break; sleep 0.2; done; "
              "runuser -u alice -- env ENROOT_ALLOW_HTTP=yes timeout 60 enroot digest "
              "'docker://localhost:5005#test/image:1'; rc=$?; kill %1; exit $rc")
    digest = gpu01.check_output("timeout 90 bash -c " + shlex.quote(script))
    sent = "Basic " + base64.b64encode(f"ci-robot:{token}".encode()).decode()
    assert digest == "sha256:" + hashlib.sha256(sent.encode()).hexdigest()
