"""Ansible plugins that ``provision apply`` puts on Ansible's plugin path (not imported by
provisioner itself: Ansible loads them by file)."""
