#!/bin/bash
# Build the lab's Debian 12 container template once, as a PVE-style vztmpl:
#   /var/lib/vz/template/cache/debian-12-standard_12.7-1_amd64.tar.zst
# lxc-create's debian template runs debootstrap; the mirror must be given explicitly
# (docs/lab.md, "Container template"). Safe to rerun: does nothing when the template exists.
set -euo pipefail
OUT=${1:-/var/lib/vz/template/cache/debian-12-standard_12.7-1_amd64.tar.zst}
NAME=inferops-lab-tmplbuild
PKGS=python3,python3-venv,python3-pip,systemd,systemd-sysv,procps,psmisc,iproute2,curl,ca-certificates,ifupdown,openssh-server,less
[ -s "$OUT" ] && exit 0
MIRROR=${MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
export MIRROR
lxc-destroy -n "$NAME" >/dev/null 2>&1 || true
rm -rf "/var/lib/lxc/$NAME"
lxc-create -t debian -n "$NAME" -- -r bookworm --packages="$PKGS" >/var/lib/inferops-lab/template-build.log 2>&1 \
  || { echo "lxc-create failed, see /var/lib/inferops-lab/template-build.log" >&2; exit 1; }
R=/var/lib/lxc/$NAME/rootfs
# What a PVE template leaves for pct to fill in at create time: no host keys, no machine-id.
rm -f "$R"/etc/ssh/ssh_host_* "$R"/etc/hostname
: >"$R/etc/machine-id"
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/*_Packages
mkdir -p "$(dirname "$OUT")"
tar -C "$R" --numeric-owner --xattrs -cf - . | zstd -q -T2 -3 -o "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
lxc-destroy -n "$NAME" >/dev/null 2>&1 || rm -rf "/var/lib/lxc/$NAME"
