"""Area storage: ZFS, NFS, MergerFS and the fabric (OFED, IPoIB, RDMA)."""
