"""The slurm area's secrets before an apply (its registry entry's ``prepare``,
``secret_envs`` and ``secret_values``): the cluster's munge key (``munge.py``) and the
registry logins of containers in jobs (``containers.py``), both in the state directory's
secrets/."""

from __future__ import annotations

from provisioner.areas.slurm import containers, munge
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.state import StateDir


def prepare(loaded: Loaded, state: StateDir) -> None:
    """The munge key, then the registry logins (whose reading can fail on a missing variable)."""
    munge.prepare_munge_key(loaded, state)
    containers.prepare_credentials(loaded, state)


def secret_envs(m: Manifest) -> set[str]:
    return containers.secret_envs(m)


def secret_values(state: StateDir) -> list[str]:
    return munge.secret_values(state) + containers.secret_values(state)
