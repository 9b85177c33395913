"""Area gpu: NVIDIA driver, CUDA, NCCL, Docker and the NVIDIA container toolkit."""
