"""Area slurm: munge and Slurm (controller, compute nodes, accounting)."""
