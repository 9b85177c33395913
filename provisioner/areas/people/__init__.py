"""The people who use the cluster: users and groups with fixed ids, their homes (local or on an NFS export)."""
