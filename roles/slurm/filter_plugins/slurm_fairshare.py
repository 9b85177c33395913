"""Filter ``slurm_fairshare_drift``: the manifest's accounts, associations and QOS against
sacctmgr's and squeue's output (role slurm, tasks/fairshare.yml).

The comparison lives in :func:`provisioner.areas.slurm.accounts.fairshare_drift` (pure,
unit-tested on recorded output in tests/areas/slurm/test_accounts.py); this plugin only
exposes it to the role.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm.accounts import fairshare_drift


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"slurm_fairshare_drift": fairshare_drift}
