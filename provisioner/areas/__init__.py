"""The areas of the cluster, one package each: ``common``, ``storage``, ``people``, ``gpu``, ``slurm``,
``baremetal``, ``monitoring``, ``backup``. An area owns its decisions (``decide.py``: pure functions of
the manifest; storage's are split by concern), its role variables and inventory groups
(``rolevars.py``), its whole-manifest checks (``checks.py``) and its checks of a running
node (``verify.py``).

``provisioner.areas.registry`` lists them, one entry per area, for the engine above, which
imports no area by name. Areas import only areas, the manifest layer and what lies below
them (``provisioner.errors``, ``state``, ``bmc``, ``image``, ``nodecheck``);
docs/design.md, "Layers".
"""
