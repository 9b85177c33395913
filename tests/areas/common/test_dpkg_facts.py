"""The common role's package facts module (roles/common/library/dpkg_package_facts.py): dpkg's
database as package_facts' ``packages``, parsed here, and run by real Ansible on this
machine's dpkg in tests/test_apt_skip.py."""

from __future__ import annotations

from tests.areas.roletemplates import role_module

FACTS = role_module("common", "dpkg_package_facts")


def test_installed_packages_only_with_their_version_and_architecture() -> None:
    text = ("adduser\tall\t3.134\tinstall ok installed\n"
            "libc6\tamd64\t2.36-9+deb12u10\tinstall ok installed\n"
            "libc6\ti386\t2.36-9+deb12u10\thold ok installed\n"
            "nano\tamd64\t7.2-1\tdeinstall ok config-files\n"
            "vim\tamd64\t2:9.0.1378-2\tinstall ok half-configured\n"
            "zfsutils-linux\tamd64\t\tinstall ok not-installed\n"
            "\n")
    assert FACTS.parse(text) == {
        "adduser": [{"name": "adduser", "version": "3.134", "arch": "all", "source": "apt"}],
        "libc6": [{"name": "libc6", "version": "2.36-9+deb12u10", "arch": "amd64", "source": "apt"},
                  {"name": "libc6", "version": "2.36-9+deb12u10", "arch": "i386", "source": "apt"}],
    }


def test_lines_it_does_not_know_are_left_out() -> None:
    assert FACTS.parse("no tabs here\nname\tonly\ttwo\n\tall\t1\tinstall ok installed\n") == {}


def test_the_query_names_the_fields_the_parser_reads_in_order() -> None:
    assert FACTS.QUERY_FORMAT == r"${Package}\t${Architecture}\t${Version}\t${Status}\n"
