#!/bin/sh
# Test bed only (molecule scenario `gpu-docker`): NVIDIA's container toolkit repository is
# unreachable here, so this builds a signed local apt repository with STAND-IN packages
# of the same names and version. They carry no NVIDIA code:
#   nvidia-container-toolkit       /usr/bin/nvidia-container-runtime -> execs runc
#   nvidia-container-toolkit-base  /usr/bin/nvidia-ctk that only answers --version
#   libnvidia-container-tools, libnvidia-container1: empty
# The role's real install path (deb822 repository with signed-by, pinned versions, holds)
# runs against it unchanged. Usage: build-standin-toolkit-repo.sh VERSION REPO_DIR KEYRING
set -eu
VERSION=$1
REPO=$2
KEYRING=$3
ARCH=amd64
WORK=$(mktemp -d)
mkdir -p "$REPO/$ARCH"

build() {  # name depends files...
  name=$1; depends=$2; shift 2
  dir=$WORK/$name
  mkdir -p "$dir/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $VERSION"
    echo "Architecture: $ARCH"
    echo "Maintainer: provisioner test bed <root@localhost>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Description: STAND-IN for NVIDIA's $name (test bed, no NVIDIA code)"
  } >"$dir/DEBIAN/control"
  for f in "$@"; do
    mkdir -p "$dir/usr/bin"
    cp "$WORK/$f" "$dir/usr/bin/$f"
    chmod 0755 "$dir/usr/bin/$f"
  done
  dpkg-deb --root-owner-group --build "$dir" "$REPO/$ARCH/${name}_${VERSION}_${ARCH}.deb" >/dev/null
}

cat >"$WORK/nvidia-container-runtime" <<'SH'
#!/bin/sh
# STAND-IN nvidia-container-runtime (test bed): no GPU hooks, hands everything to runc.
exec /usr/sbin/runc "$@"
SH
cat >"$WORK/nvidia-ctk" <<SH
#!/bin/sh
# STAND-IN nvidia-ctk (test bed): knows --version only; no CDI without GPUs anyway.
case "\${1:-}" in
  --version|-v) echo "NVIDIA Container Toolkit CLI version ${VERSION%-*} (STAND-IN)"; exit 0 ;;
esac
echo "nvidia-ctk STAND-IN: \$* is not supported" >&2
exit 1
SH

build libnvidia-container1 ""
build libnvidia-container-tools "libnvidia-container1 (= $VERSION)"
build nvidia-container-toolkit-base "" nvidia-ctk
build nvidia-container-toolkit "nvidia-container-toolkit-base (= $VERSION), libnvidia-container-tools (= $VERSION)" nvidia-container-runtime

# signing key and signed flat repository (suite "/")
export GNUPGHOME="$WORK/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key "provisioner test bed <root@localhost>" ed25519 sign never
gpg --batch --export >"$KEYRING"
cd "$REPO/$ARCH"
apt-ftparchive packages . >Packages
apt-ftparchive release . >Release
gpg --batch --yes --clearsign -o InRelease Release
rm -rf "$WORK"
