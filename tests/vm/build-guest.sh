#!/usr/bin/env bash
# Builds the test VM's guest once: a Debian 12 root (mmdebstrap, or debootstrap, minbase)
# with the storage stacks reseq must handle (LVM, thin pools, dm-crypt, md) and systemd
# as PID 1, as an ext4 image plus the kernel and initrd to boot it directly.
#
#   tests/vm/build-guest.sh            prints the directory of the built guest
#
# The guest lives outside the checkout, in $RESEQ_VM_CACHE (default
# /var/cache/reseq-vm), under a key made of this script, the in-guest boot unit and the
# candidate versions of the packages it installs: a change to any of them builds a new
# guest; otherwise the cached one is reused. Scenarios are not part of the image: the
# harness hands them over at every boot (tests/vm/run.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${RESEQ_VM_CACHE:-/var/cache/reseq-vm}
mirror=${RESEQ_VM_MIRROR:-http://deb.debian.org/debian}
suite=bookworm

# What the guest needs: a kernel with device-mapper and md, systemd as PID 1 (with D-Bus,
# for the guardian's transient scope; man-db for systemd-analyze verify), the storage
# tools, the filesystems' tools, jq to read reseq's reports, smartmontools for the NVMe
# SMART counters that `rewrite --bench` reads; for the fleet scenario, an SSH server and
# what Ansible's modules run on (python3; python3-apt for its apt module's `deb:`).
pkgs=(linux-image-amd64 systemd systemd-sysv udev dbus kmod procps
      lvm2 thin-provisioning-tools cryptsetup-bin mdadm dmsetup
      e2fsprogs xfsprogs btrfs-progs fdisk util-linux jq man-db smartmontools
      openssh-server python3 python3-apt)

need() { command -v "$1" >/dev/null; }
# mmdebstrap: apt's parallel downloads and one dpkg run (63 s here where debootstrap took
# 140-180 s, most of a clean CI machine's guest build); debootstrap where it cannot be had.
if ! need mmdebstrap || ! need mkfs.ext4; then
  echo "build-guest: installing mmdebstrap" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap e2fsprogs >/dev/null \
    || need debootstrap \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap e2fsprogs >/dev/null
fi
if need mmdebstrap; then bootstrap=mmdebstrap; else bootstrap=debootstrap; fi

# The key: this script, the boot unit, and the versions apt would install now.
versions=$(apt-cache policy "${pkgs[@]}" 2>/dev/null | awk '/^[^ ]/{p=$1} /Candidate:/{print p, $2}')
if [ -z "$versions" ] || grep -q '(none)' <<<"$versions"; then
  # No Debian package lists on this host (or not the same suite): key on the date,
  # a new guest a week at most.
  versions="week $(date +%G-%V)"
fi
key=$( { cat "$here/build-guest.sh" "$here"/guest/boot/*; echo "$bootstrap"; echo "$versions"; } | sha256sum | cut -c1-16)
dir="$cache/$key"
if [ -f "$dir/ready" ]; then echo "$dir"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -f "$dir/ready" ]; then echo "$dir"; exit 0; fi

t0=$(date +%s)
work=$(mktemp -d "$cache/.build.XXXXXX")
cleanup() {
  for m in proc sys dev; do umount -l "$work/root/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
echo "build-guest: $bootstrap $suite (${pkgs[*]}) into $work" >&2
inc=$(IFS=,; echo "${pkgs[*]}")
if [ "$bootstrap" = mmdebstrap ]; then
  # The merged-usr hook makes /usr merged as debootstrap does (else apt pulls usrmerge,
  # and perl with it).
  hooks=()
  [ -d /usr/share/mmdebstrap/hooks/merged-usr ] && hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
  mmdebstrap --variant=minbase --include="$inc" "${hooks[@]}" "$suite" "$work/root" "$mirror" >"$work/bootstrap.log" 2>&1
else
  debootstrap --variant=minbase --include="$inc" "$suite" "$work/root" "$mirror" >"$work/bootstrap.log" 2>&1
fi || { tail -30 "$work/bootstrap.log" >&2; echo "build-guest: $bootstrap failed" >&2; exit 1; }

root=$work/root
# The boot unit runs the scenarios handed over on the 9p share, then powers off.
install -m 755 "$here/guest/boot/reseq-vm-boot" "$root/usr/local/sbin/reseq-vm-boot"
install -m 644 "$here/guest/boot/reseq-vm.service" "$root/etc/systemd/system/reseq-vm.service"
ln -sf /etc/systemd/system/reseq-vm.service "$root/etc/systemd/system/multi-user.target.wants/reseq-vm.service"
echo reseq-vm >"$root/etc/hostname"
echo "/dev/vda / ext4 rw,errors=remount-ro 0 1" >"$root/etc/fstab"
# No logins, no waiting for a network: only what the scenarios need.
for u in getty@tty1.service serial-getty@ttyS0.service systemd-networkd-wait-online.service \
         apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
         fstrim.timer mdmonitor.service mdcheck_start.timer mdcheck_continue.timer \
         mdmonitor-oneshot.timer lvm2-monitor.service smartmontools.service smartd.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done
# The SSH server starts only in the fleet scenario, which configures the network too
# (no boot waits for either); the host keys the package made are the guest's.
rm -f "$root"/etc/systemd/system/multi-user.target.wants/ssh.service "$root"/etc/systemd/system/sshd.service
# md: no automatic assembly of stray arrays.
echo "AUTO -all" >>"$root/etc/mdadm/mdadm.conf"
rm -f "$root"/var/cache/apt/archives/*.deb
mkdir -p "$dir.tmp"
kver=$(ls "$root/boot" | sed -n 's/^vmlinuz-//p' | sort -V | tail -1)
cp "$root/boot/vmlinuz-$kver" "$dir.tmp/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$dir.tmp/initrd.img"
# Room for the tree and a few hundred MiB of scenario state (the root is booted with
# snapshot=on: the image itself is never written).
size_mb=$(( $(du -sm "$root" | cut -f1) + 768 ))
# stdout is this script's answer (the guest's directory): mke2fs says "Creating regular
# file" there, -q or not, when it makes the image itself.
truncate -s "${size_mb}M" "$dir.tmp/root.img"
mkfs.ext4 -q -F -L reseq-vm -d "$root" "$dir.tmp/root.img" >&2
{ echo "kernel $kver"; echo "$versions"; } >"$dir.tmp/versions"
rm -rf "$dir"; mv "$dir.tmp" "$dir"
touch "$dir/ready"
echo "build-guest: built $dir in $(( $(date +%s) - t0 )) s" >&2
# Older guests of this cache are stale: keep only this one.
for old in "$cache"/*/; do [ "${old%/}" = "$dir" ] || rm -rf "${old%/}"; done
echo "$dir"
