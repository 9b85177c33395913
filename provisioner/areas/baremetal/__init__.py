"""Area baremetal: OS installs over BMC + PXE (installer configs, the PXE server, the install lifecycle)."""
