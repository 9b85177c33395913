"""Where the Ansible content is: ``playbooks/`` and ``roles/`` (one lookup for plan and apply).

* ``$PROVISION_HOME``, when set: an explicit override (a checkout or an unpacked collection).
* An installed wheel: the build ships both as the Ansible collection ``provisioner.cluster``
  inside the package, ``provisioner/ansible_collections/provisioner/cluster/{roles,playbooks}``
  (see setup.py), found with importlib.resources.
* A source checkout (editable install, tests): the repository's top-level ``roles/`` and
  ``playbooks/``.

Roles keep their short names (``common``, ``zfs``): ``ANSIBLE_ROLES_PATH`` points at the
``roles/`` found here (see :func:`ansible_paths`).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from provisioner.errors import ProvisionError

COLLECTION = ("provisioner", "cluster")  # namespace, name (setup.py builds it)


def has_playbooks(root: Path) -> bool:
    return (root / "playbooks" / "site.yml").is_file()


def installed_root() -> Path | None:
    """The collection inside the installed package, if the build put it there."""
    package = resources.files("provisioner")
    if not isinstance(package, Path):  # not on a file system (e.g. a zip): Ansible could not use it
        return None
    root = package.joinpath("ansible_collections", *COLLECTION)
    return root if has_playbooks(root) else None


def checkout_root() -> Path:
    """The source checkout this package was imported from (valid only in a checkout)."""
    return Path(__file__).resolve().parents[1]


def project_root() -> Path:
    """Where playbooks/ and roles/ live: $PROVISION_HOME, the installed collection, or the
    source checkout."""
    env = os.environ.get("PROVISION_HOME")
    if env:
        root = Path(env)
        if not has_playbooks(root):
            raise ProvisionError(f"playbooks not found under {root} (PROVISION_HOME); unset it or point it "
                                 "at a checkout of this project")
        return root
    installed = installed_root()
    if installed is not None:
        return installed
    root = checkout_root()
    if not has_playbooks(root):
        raise ProvisionError(
            f"playbooks not found: neither in the installed package nor under {root}; reinstall provisioner "
            "(pip install .) or set PROVISION_HOME to a checkout of this project"
        )
    return root


def ansible_paths(root: Path) -> dict[str, str]:
    """ANSIBLE_ROLES_PATH for ``root``: the playbooks' short role names resolve there.

    Deliberately no ANSIBLE_COLLECTIONS_PATH to the installed collection: a playbook inside
    a collection on that path runs in the collection's context, where roles cannot bring
    their own ``library/`` and ``filter_plugins/`` (nvidia_driver, slurm and zfs do), so
    the installed content runs exactly as the checkout's does in the tests.
    """
    return {"ANSIBLE_ROLES_PATH": str(root / "roles")}
