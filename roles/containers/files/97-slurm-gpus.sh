#!/bin/bash
# Installed by the provision role `containers`. enroot hook: inside a Slurm job step,
# ENROOT_RESTRICT_DEV gives the container a private /dev (10-devices.sh); this adds exactly
# the GPUs Slurm gave the step (SLURM_STEP_GPUS, else SLURM_JOB_GPUS: the nodes' device
# indexes from gres.conf) and the NVIDIA control devices, and tells 98-nvidia.sh (which
# mounts the driver's libraries through nvidia-container-cli) the same GPUs. Outside Slurm,
# or without a private /dev, it does nothing: the device cgroup still fences the job.
set -euo pipefail

gpus="${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}"
if [ -z "${SLURM_JOB_ID-}" ] || [ -z "${ENROOT_RESTRICT_DEV-}" ] || [ -z "${gpus}" ]; then
    exit 0
fi

for dev in nvidiactl nvidia-uvm nvidia-uvm-tools nvidia-modeset; do
    [ -e "/dev/${dev}" ] || continue
    printf "/dev/%s /dev/%s none x-create=file,bind,rw,nosuid,noexec,private,nofail,silent\n" "${dev}" "${dev}" >> "${ENROOT_MOUNTS}"
done
for index in ${gpus//,/ }; do
    case "${index}" in
    *[!0-9]*) continue ;;  # a MIG or UUID form: left to 98-nvidia.sh
    esac
    printf "/dev/nvidia%s /dev/nvidia%s none x-create=file,bind,rw,nosuid,noexec,private\n" "${index}" "${index}" >> "${ENROOT_MOUNTS}"
done
# 98-nvidia.sh fails without nvidia-container-cli: name the GPUs only where it can act on them
if command -v nvidia-container-cli > /dev/null; then
    printf "NVIDIA_VISIBLE_DEVICES=%s\n" "${gpus}" >> "${ENROOT_ENVIRON}"
fi
