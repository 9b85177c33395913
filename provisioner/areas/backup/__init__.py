"""The backup area: backups of the head node (slurmdbd's database, slurmctld's state, the
munge key encrypted, Prometheus' TSDB snapshot) to a local path, a storage node's dataset or
an SSH target, on a timer with retention, and their restore (docs/backup.md)."""
