"""The areas of the cluster, one package each: ``common``, ``gpu``, ``storage``, ``slurm``,
``baremetal``. An area owns its decisions (``decide.py``: pure functions of the manifest),
its role variables (``rolevars.py``) and its whole-manifest checks (``checks.py``).

Areas import the manifest layer (and ``provisioner.errors``, ``provisioner.state``,
``provisioner.bmc``), never plan, inventory, apply, validate, the commands or the CLI.
``provisioner.areas.registry`` lists them for the layers above (docs/design.md).
"""
