"""Filter ``slurm_fact_report``: a node's facts against the manifest (role slurm).

The comparison lives in :func:`provisioner.areas.slurm.facts.fact_report` (pure, unit-tested
in tests/areas/slurm/test_decide.py); this plugin only exposes it to the role. The role runs
from the provisioner's own environment, where the package is importable.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm.facts import fact_report


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"slurm_fact_report": fact_report}
