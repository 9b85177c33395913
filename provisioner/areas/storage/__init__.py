"""Area storage: ZFS, NFS, MergerFS, local scratch (the RDMA fabric is its own area, fabric)."""
