"""What a node OS image is made of, and the mmdebstrap command line that builds it. Pure.

An image is a root file system tarball (``<os>.tar.zst``) built by mmdebstrap from the
manifest's apt mirror (``cluster.mirrors.apt``; its proxy too). It holds the kernel, an SSH
server, Python, the boot loaders for UEFI and BIOS, mdadm (a RAID1 root) and a first-boot
unit, and nothing site-specific: no host keys, an empty machine-id, no users but root
(locked). The deploy agent writes the node's identity on top of it.

The cache key hashes every input of the build (OS, suite, mirror, components, apt sources,
package list, the customize hook's text, the first-boot unit, the recipe version): an image is
rebuilt only when one of them changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

from provisioner.manifest.cluster import BUILT_IMAGE_EXT
from provisioner.manifest.fields import OsName
from provisioner.platforms import PLATFORMS

RECIPE_VERSION = 1
# netbase: /etc/protocols and /etc/services, which mmdebstrap's apt variant leaves out and
# without which mount.nfs fails ("Failed to find 'tcp' protocol"); procps: ps, sysctl, pgrep.
COMMON_PACKAGES = (
    "systemd-sysv", "udev", "kmod", "dbus", "iproute2", "openssh-server", "python3", "sudo",
    "ca-certificates", "e2fsprogs", "mdadm", "initramfs-tools", "netbase", "procps",
    "grub-pc-bin", "grub-efi-amd64-bin", "grub2-common",
)


@dataclass(frozen=True)
class OsImage:
    """What the image of one OS is built from. The facts and their sources: docs/versions.md,
    "Node images"."""

    distro: str  # debian, ubuntu
    suite: str
    default_mirror: str
    components: tuple[str, ...]  # every component of the OS's standard sources
    pockets: tuple[str, ...]  # suites of the main archive besides the release (-updates ...)
    security_pocket: str
    kernel: str
    packages: tuple[str, ...]  # besides COMMON_PACKAGES and the kernel
    hook_dirs: tuple[str, ...] = ()  # mmdebstrap --hook-dir

    def security_mirror(self, mirror: str) -> str:
        """Where ``mirror``'s security pocket lives: Debian's is a tree of its own beside the
        archive (.../debian -> .../debian-security), Ubuntu's is in the archive."""
        return re.sub(r"/debian/?$", "/debian-security", mirror) if self.distro == "debian" else mirror

    def sources(self, mirror: str) -> tuple[str, ...]:
        """The image's apt sources (one-line format): every pocket and component of the OS, as
        its own installer writes them, so that a node gets its security updates and restricted
        packages (Canonical's signed NVIDIA modules) without a manifest mirror."""
        comps = " ".join(self.components)
        main = [f"deb {mirror} {suite} {comps}" for suite in (self.suite, *self.pockets)]
        return (*main, f"deb {self.security_mirror(mirror)} {self.security_pocket} {comps}")


# The archive keyring mmdebstrap checks each distribution's Release files with (--keyring),
# on the build host, and how to get it there: Debian 12's main archive has no Ubuntu keyring
# (ubuntu-keyring is in bookworm-backports; Ubuntu hosts have it installed).
KEYRINGS: dict[str, tuple[str, str]] = {
    "debian": ("/usr/share/keyrings/debian-archive-keyring.gpg", "apt-get install debian-archive-keyring"),
    "ubuntu": ("/usr/share/keyrings/ubuntu-archive-keyring.gpg",
               "apt-get install ubuntu-keyring (on Debian 12 from bookworm-backports: "
               "apt-get install -t bookworm-backports ubuntu-keyring)"),
}


# jammy has no usr-is-merged in its essential set (noble and bookworm do): without this hook
# of mmdebstrap's a jammy image has a split /usr, unlike every other jammy install.
MERGED_USR = "/usr/share/mmdebstrap/hooks/merged-usr"
# The signed boot chain (Microsoft-signed shim, the distribution-signed GRUB; Debian 12 and
# Ubuntu both have the two packages in main): with them the deploy agent's grub-install puts
# shim on the ESP, so Secure Boot can be turned on later (docs/baremetal.md, "Secure Boot").
SIGNED_BOOT = ("shim-signed", "grub-efi-amd64-signed")
# Ubuntu images also carry the archive keyring for the node's own apt (mmdebstrap's --keyring
# stays out of the image).
UBUNTU_BOOT = ("ubuntu-keyring", *SIGNED_BOOT)
# Components and pockets: the same as the common role writes for a mirror
# (roles/common/vars/<OS>.yml; a test holds them equal).
DEBIAN_COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
UBUNTU_COMPONENTS = ("main", "restricted", "universe", "multiverse")


def _image(name: OsName, mirror: str, components: tuple[str, ...], pockets: tuple[str, ...], kernel: str,
           packages: tuple[str, ...], hook_dirs: tuple[str, ...] = ()) -> OsImage:
    """An OS's image recipe: family and suite from the platform table, the pockets named by
    their suffix (``updates`` -> ``jammy-updates``)."""
    p = PLATFORMS[name]
    return OsImage(p.family, p.codename, mirror, components, tuple(f"{p.codename}-{s}" for s in pockets),
                   f"{p.codename}-security", kernel, packages, hook_dirs)


# One entry per OS of the manifest (provisioner.manifest.fields.OsName; a test holds them equal).
# systemd-resolved: its own package in Debian 12 and Ubuntu 24.04 (noble split it out of
# systemd 255); part of the systemd package in Ubuntu 22.04 (systemd 249), where no package
# of that name exists. Ubuntu's netplan writes systemd-networkd files; Debian gets
# systemd-networkd files directly.
OS_IMAGES: dict[OsName, OsImage] = {
    "debian-12": _image("debian-12", "http://deb.debian.org/debian", DEBIAN_COMPONENTS, ("updates",),
                        "linux-image-amd64", ("systemd-resolved", *SIGNED_BOOT)),
    "ubuntu-22.04": _image("ubuntu-22.04", "http://archive.ubuntu.com/ubuntu", UBUNTU_COMPONENTS,
                           ("updates", "backports"), "linux-image-generic", ("netplan.io", *UBUNTU_BOOT),
                           (MERGED_USR,)),
    "ubuntu-24.04": _image("ubuntu-24.04", "http://archive.ubuntu.com/ubuntu", UBUNTU_COMPONENTS,
                           ("updates", "backports"), "linux-image-generic",
                           ("netplan.io", "systemd-resolved", *UBUNTU_BOOT)),
}

FIRSTBOOT_UNIT = """\
[Unit]
Description=provision: first boot of a deployed node image
ConditionPathExists=!/var/lib/provision/firstboot.done
Before=ssh.service
After=local-fs.target

[Service]
Type=oneshot
# host keys come from the deploy agent (it reported them); make them only if one is missing
ExecStart=/usr/bin/ssh-keygen -A
ExecStart=/bin/sh -c 'for f in /etc/provision/firstboot.d/*; do [ -x "$f" ] && "$f"; done; true'
ExecStart=/bin/sh -c 'mkdir -p /var/lib/provision && touch /var/lib/provision/firstboot.done'
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""

# where mmdebstrap keeps its --aptopt settings inside the new root
APTOPT_FILE = "/etc/apt/apt.conf.d/99mmdebstrap"
# apt inside the build waits this long for the dpkg lock, not forever (nor not at all)
LOCK_TIMEOUT = 120

# mmdebstrap --customize-hook: runs on the host with the new root as $1.
CUSTOMIZE_HOOK = (
    'set -e; r="$1"; '
    'rm -f "$r"/etc/ssh/ssh_host_*; '
    # a key a package made at build time would be every deployed node's until its role
    # writes the cluster's (munge's)
    'rm -f "$r"/etc/munge/munge.key; '
    ': > "$r"/etc/machine-id; rm -f "$r"/var/lib/dbus/machine-id; '
    'install -d "$r"/etc/provision/firstboot.d "$r"/var/lib/provision; '
    'printf "%s" "$PROVISION_FIRSTBOOT_UNIT" > "$r"/etc/systemd/system/provision-firstboot.service; '
    'chroot "$r" systemctl enable provision-firstboot.service systemd-networkd.service systemd-resolved.service; '
    # an empty machine-id makes the first boot a "first boot": systemd-firstboot would ask
    # for a locale and a time zone on the console and wait there
    'chroot "$r" systemctl mask systemd-firstboot.service; '
    'ln -sf ../run/systemd/resolve/stub-resolv.conf "$r"/etc/resolv.conf; '
    'chroot "$r" passwd -l root; '
    'rm -f "$r"/etc/hostname; '
    # the build's apt options (--aptopt: the build host's proxy, its timeouts) stay behind
    # in the image otherwise; a node's apt settings come from the common role
    f'rm -f "$r"{APTOPT_FILE}; '
    'rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/*'
)


# The deploy ramdisk: a small Debian system that runs from RAM (the whole tree is the
# initramfs, systemd its init), gets its address over DHCP and runs the deploy agent.
RAMDISK = "deploy-ramdisk"
RAMDISK_OS: OsName = "debian-12"  # whatever OS the nodes run
RAMDISK_COMPONENTS = ("main",)
RAMDISK_PACKAGES = (
    "linux-image-amd64", "systemd-sysv", "udev", "kmod", "iproute2", "python3", "gdisk", "parted",
    "mdadm", "dosfstools", "e2fsprogs", "util-linux", "tar", "gzip", "xz-utils", "zstd",
)
RAMDISK_UNIT = """\
[Unit]
Description=provision: deploy this node's OS image (its plan comes from the head node)
Wants=network-online.target
After=network-online.target systemd-udev-settle.service
Wants=systemd-udev-settle.service

[Service]
Type=oneshot
StandardOutput=journal+console
StandardError=journal+console
# on success the node boots its new disk; on failure it stays here (the failure is reported
# to the head node, which boots the node from its disk next time)
ExecStart=/bin/sh -c '/usr/local/sbin/provision-deploy && systemctl reboot'

[Install]
WantedBy=multi-user.target
"""
RAMDISK_NETWORK = "[Match]\nName=e*\n\n[Network]\nDHCP=ipv4\n"
# kernel modules a deploy never needs (graphics, sound, wireless, media, InfiniBand...):
# the ramdisk lives in RAM. Every Ethernet driver stays: the provisioning NIC of a GPU
# server is as often a ConnectX (mlx5_core) as an Intel or Broadcom one, and without its
# driver the ramdisk gets no DHCP lease.
RAMDISK_DROP = ("drivers/gpu", "drivers/media", "drivers/net/wireless", "drivers/infiniband", "sound",
                "drivers/staging", "drivers/bluetooth", "net/wireless", "net/bluetooth", "drivers/iio",
                "drivers/hid", "drivers/input/touchscreen", "drivers/isdn", "drivers/usb/gadget",
                "drivers/net/can", "fs/ocfs2", "fs/gfs2", "fs/btrfs", "fs/xfs")
RAMDISK_HOOK = (
    'set -e; r="$1"; '
    'printf "%s" "$PROVISION_AGENT" > "$r"/usr/local/sbin/provision-deploy; '
    'chmod 0755 "$r"/usr/local/sbin/provision-deploy; '
    'printf "%s" "$PROVISION_DEPLOY_UNIT" > "$r"/etc/systemd/system/provision-deploy.service; '
    'printf "%s" "$PROVISION_DEPLOY_NETWORK" > "$r"/etc/systemd/network/90-deploy-dhcp.network; '
    'chroot "$r" systemctl enable provision-deploy.service systemd-networkd.service; '
    'chroot "$r" systemctl mask systemd-firstboot.service; '
    ': > "$r"/etc/machine-id; echo deploy > "$r"/etc/hostname; '
    'chroot "$r" passwd -l root; '
    f'rm -f "$r"{APTOPT_FILE}; '
    'for d in $PROVISION_DROP; do rm -rf "$r"/lib/modules/*/kernel/"$d"; done; '
    'for k in "$r"/lib/modules/*; do chroot "$r" depmod -a "${k##*/}"; done; '
    'ln -sf /lib/systemd/systemd "$r"/init; '
    'rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/usr/share/doc "$r"/usr/share/man '
    '"$r"/usr/share/locale "$r"/boot/initrd.img-*'
)


class ImageRecipeError(ValueError):
    """The manifest asks for an image this recipe cannot build (the message says why)."""


@dataclass(frozen=True)
class ImageRecipe:
    os: str
    distro: str
    suite: str
    mirror: str
    proxy: str | None
    components: tuple[str, ...]
    packages: tuple[str, ...]
    sources: tuple[str, ...]  # the apt sources it is built from and keeps (one-line format)
    hook_dirs: tuple[str, ...]  # mmdebstrap --hook-dir (merged /usr)
    firstboot_unit: str = FIRSTBOOT_UNIT
    customize_hook: str = CUSTOMIZE_HOOK
    version: int = RECIPE_VERSION
    agent: str = ""  # the deploy agent's source (the deploy ramdisk only)

    @property
    def key(self) -> str:
        """Content hash of every input of the build (16 hex digits)."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def file_name(self) -> str:
        return f"{self.os}-{self.key}{BUILT_IMAGE_EXT}"


def recipe(os_name: str, mirror: str | None, proxy: str | None = None,
           extra_packages: tuple[str, ...] = ()) -> ImageRecipe:
    """The recipe for ``os_name`` from ``mirror`` (None: the distribution's own archive);
    ``extra_packages``: what every node of the cluster installs anyway (the monitoring agent),
    so that a deployed node's first apply does not unpack it. None: the same key as before."""
    facts = next((f for name, f in OS_IMAGES.items() if name == os_name), None)
    if facts is None:
        raise ImageRecipeError(f"no image recipe for {os_name!r}; known: {', '.join(sorted(OS_IMAGES))}")
    packages = {facts.kernel, *COMMON_PACKAGES, *facts.packages, *extra_packages}
    base = (mirror or facts.default_mirror).rstrip("/")
    return ImageRecipe(os_name, facts.distro, facts.suite, base, proxy, facts.components, tuple(sorted(packages)),
                       facts.sources(base), facts.hook_dirs)


def ramdisk_recipe(mirror: str | None, proxy: str | None, agent: str) -> ImageRecipe:
    """The deploy ramdisk, from the Debian archive (``mirror`` when the cluster's nodes run
    Debian, else Debian's own); ``agent``: the deploy agent's source text."""
    debian = OS_IMAGES[RAMDISK_OS]
    base = (mirror or debian.default_mirror).rstrip("/")
    # the ramdisk runs no apt: the release's main component is all it needs
    sources = (f"deb {base} {debian.suite} {' '.join(RAMDISK_COMPONENTS)}",)
    return ImageRecipe(RAMDISK, debian.distro, debian.suite, base, proxy, RAMDISK_COMPONENTS,
                       tuple(sorted(RAMDISK_PACKAGES)), sources, debian.hook_dirs, RAMDISK_UNIT, RAMDISK_HOOK,
                       RECIPE_VERSION, agent)


def mmdebstrap_command(r: ImageRecipe, output: str, fmt: str = "tar") -> list[str]:
    """The mmdebstrap command line that builds ``r`` into the tarball ``output`` (the
    extension .tar.gz makes mmdebstrap compress it; ``fmt`` directory: a tree). Needs root
    (``--mode=root``); the texts the hook writes come in the environment
    (:func:`build_environment`)."""
    cmd = [
        "mmdebstrap", "--mode=root", "--variant=apt", f"--format={fmt}",
        f"--components={','.join(r.components)}",
        f"--include={','.join(r.packages)}",
        "--aptopt=Acquire::Retries \"3\"",
        # retry at once: a delayed retry can leave apt's queue stuck for good (LP: #2003851,
        # tests/testbed/README.md); these options are the build's only (the hook removes them)
        "--aptopt=Acquire::Retries::Delay \"false\"",
        "--aptopt=Acquire::http::Timeout \"60\"",
        f"--aptopt=DPkg::Lock::Timeout \"{LOCK_TIMEOUT}\"",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        *(f"--hook-dir={d}" for d in r.hook_dirs),
        f"--customize-hook={r.customize_hook}",
    ]
    if r.proxy:
        cmd.append(f"--aptopt=Acquire::http::Proxy \"{r.proxy}\"")
    cmd.append(f"--keyring={KEYRINGS[r.distro][0]}")
    cmd += [r.suite, output, *r.sources]
    return cmd


def build_environment(r: ImageRecipe) -> dict[str, str]:
    """Variables the build's hook reads (added to the caller's environment)."""
    env = {"PROVISION_FIRSTBOOT_UNIT": r.firstboot_unit, "SOURCE_DATE_EPOCH": "0"}
    if r.os == RAMDISK:
        env |= {"PROVISION_AGENT": r.agent, "PROVISION_DEPLOY_UNIT": r.firstboot_unit,
                "PROVISION_DEPLOY_NETWORK": RAMDISK_NETWORK, "PROVISION_DROP": " ".join(RAMDISK_DROP)}
    return env
