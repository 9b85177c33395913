"""Decisions of the common area, pure: who may log in as root.

root, and a non-root account Ansible connects as (``cluster.ssh.user``, which gets
password-less sudo), are root on every node. So they carry only the SSH keys of admins
allowed root (``sudo: true``) plus the dedicated automation key ``cluster.ssh.public_key``;
an admin with ``sudo: false`` must not reach root through them. The installer
configurations (provisioner.areas.baremetal.decide) use this; the common role is to enforce
the same list on every apply (role variable to come: ``common_root_authorized_keys``).
"""

from __future__ import annotations

from provisioner.manifest.model import Manifest


def privileged_keys(m: Manifest) -> list[str]:
    """Keys of root (and of a non-root Ansible account): the keys of admins with sudo, then
    ``cluster.ssh.public_key``; each once, in manifest order."""
    keys = [k for u in m.cluster.admin_users if u.sudo for k in u.ssh_keys]
    if m.cluster.ssh.public_key:
        keys.append(m.cluster.ssh.public_key)
    return list(dict.fromkeys(keys))


def root_authorized_keys(m: Manifest) -> list[str]:
    """root's authorized_keys: the privileged keys when Ansible connects as root, else none
    (root logs in with no key)."""
    return privileged_keys(m) if m.cluster.ssh.user == "root" else []


def ansible_account_problem(m: Manifest) -> str | None:
    """Why Ansible could not log in after an install (None: it can)."""
    user = m.cluster.ssh.user
    admins = {u.name: u for u in m.cluster.admin_users}
    if user in admins:
        if not admins[user].sudo:
            return (f"cluster.ssh.user {user!r} is an admin with sudo: false; Ansible needs root on every node: "
                    "give that admin sudo or connect as another account")
        return None
    if not privileged_keys(m):
        return (f"Ansible connects as {user!r}, which gets only the keys of admins with sudo: true and "
                "cluster.ssh.public_key, and there are none; give an admin sudo or set cluster.ssh.public_key")
    return None
