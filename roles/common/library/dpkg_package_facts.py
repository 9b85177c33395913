#!/usr/bin/python
"""Ansible module: the installed packages from dpkg's database, as ``package_facts`` names them.

Why not ``ansible.builtin.package_facts``: on Debian and Ubuntu it opens python3-apt's whole
package cache (every package of every source, then each installed one's origin). Measured
on a VM lab guest under emulation (Debian 12, 367 packages installed): python3-apt's
``Cache()`` alone 9.5 s, the module's task 17.6-19.2 s in an ``apply --full``, against
0.2 s for ``dpkg-query``; on this project's 2-core AMD EPYC host (771 packages) 1.8-2.2 s
against 0.01-0.13 s. The common role reads the packages on every node at every apply (the
later roles skip apt where theirs are installed), so the difference is paid per node and
apply. The parsing (:func:`parse`) is unit-tested in tests/areas/common/test_dpkg_facts.py.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dpkg_package_facts
short_description: Installed packages from dpkg's database, in package_facts' shape
description:
  - Runs C(dpkg-query -W) and sets C(ansible_facts.packages) as
    C(ansible.builtin.package_facts) does with its apt manager, for installed packages only
    (dpkg status C(installed)): a name maps to a list of C({name, version, arch, source}).
  - Never changes anything; supports check mode.
options: {}
author: provisioner
"""

RETURN = r"""
ansible_facts:
  description: C(packages), by package name.
  type: dict
  returned: always
"""

# one line per package instance: name, architecture, version, status (want, error, state);
# dpkg-query reads the escapes \t and \n itself
QUERY_FORMAT = r"${Package}\t${Architecture}\t${Version}\t${Status}\n"


def parse(text: str) -> dict[str, list[dict[str, str]]]:
    """``dpkg-query -W -f QUERY_FORMAT`` output as package_facts' ``packages``: installed
    packages only (``install ok installed``, ``hold ok installed``); a package installed for
    two architectures gets two entries."""
    packages: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or not fields[0]:
            continue
        name, arch, version, status = fields
        if status.split()[-1:] != ["installed"]:
            continue
        packages.setdefault(name, []).append({"name": name, "version": version, "arch": arch, "source": "apt"})
    return packages


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    dpkg_query = module.get_bin_path("dpkg-query", required=True)
    rc, out, err = module.run_command([dpkg_query, "-W", "-f", QUERY_FORMAT])
    if rc != 0:
        module.fail_json(msg=f"dpkg-query -W failed (exit {rc}): {err.strip()}")
    module.exit_json(changed=False, ansible_facts={"packages": parse(out)})


if __name__ == "__main__":
    main()
