"""Area fabric: the RDMA fabrics (InfiniBand with IPoIB and a subnet manager, RoCE v2), the
OFED stack and GPUDirect RDMA; the ofed role, playbooks/fabric.yml."""
