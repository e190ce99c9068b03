#!/usr/bin/env bash
# images/build.sh [OUT_DIR]: build the minimal guest image from the
# distribution's packages only, and write its manifest into OUT_DIR (the
# image source directory, default .service/images):
#
#   <OUT_DIR>/minimal/vmlinux         the image's own guest kernel, an ELF
#                                     (PVH entry), drivers built in
#   <OUT_DIR>/minimal/initramfs.cpio  /init = compute-guest, busybox, mkfs.ext4
#   <OUT_DIR>/minimal.json            the manifest (format kernel+initrd)
#   <OUT_DIR>/minimal/disk.raw, .qcow2 the same guest as disk images booted by
#                                     firmware (syslinux on a FAT disk, the
#                                     Debian cloud kernel's bzImage, the
#                                     initramfs with its virtio modules)
#   <OUT_DIR>/minimal-raw.json, minimal-qcow2.json   their manifests
#
# The guest kernel is built from Debian's linux-source-6.1 with
# images/kernel/guest.config on top of allnoconfig, and cached under
# KERNEL_CACHE (default .service/kernel-cache) by the sha256 of the source
# package's version and the config: a rebuild of the image with neither
# changed does not build the kernel again (docs/images.md).
#
# The packages (linux-image-cloud-amd64, linux-source-6.1 and what building
# it takes, busybox (downloaded), e2fsprogs, lz4, cpio, syslinux, mtools,
# dosfstools, qemu-utils) are installed with apt-get when missing and this
# runs as root; so is qemu-system-x86, which the image does not need but the
# qemu runtime of a compute-agent on this machine does (`make run` builds
# the image, and the README's VM steps follow it).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-.service/images}")"
id="computeplane/minimal"

need=()
ls /lib/modules/*-cloud-amd64 >/dev/null 2>&1 || need+=(linux-image-cloud-amd64)
command -v dpkg-deb >/dev/null || need+=(dpkg)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v lz4 >/dev/null || need+=(lz4)
command -v cpio >/dev/null || need+=(cpio)
command -v syslinux >/dev/null || need+=(syslinux)
command -v mcopy >/dev/null || need+=(mtools)
command -v mkfs.vfat >/dev/null || need+=(dosfstools)
command -v qemu-img >/dev/null || need+=(qemu-utils)
[[ -f /usr/src/linux-source-6.1.tar.xz ]] || need+=(linux-source-6.1)
command -v xz >/dev/null || need+=(xz-utils)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v patch >/dev/null || need+=(patch)
command -v flex >/dev/null || need+=(flex)
command -v bison >/dev/null || need+=(bison)
command -v bc >/dev/null || need+=(bc)
[[ -f /usr/include/libelf.h ]] || need+=(libelf-dev)
if [[ $(id -u) -ne 0 ]]; then
	if ((${#need[@]})); then
		echo "images: install ${need[*]} (apt-get) first" >&2
		exit 1
	fi
	# Not needed for the image: a warning only.
	command -v qemu-system-x86_64 >/dev/null ||
		echo "images: compute-agent's qemu runtime needs qemu-system-x86 (apt-get install qemu-system-x86)" >&2
else
	command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
fi
if ((${#need[@]})); then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

kver="$(ls -1 /lib/modules | grep -- '-cloud-amd64$' | sort -V | tail -n 1)"
vmlinuz="/boot/vmlinuz-$kver"
mods="/lib/modules/$kver"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out/minimal"

# The guest kernel: Debian's kernel source with images/kernel/guest.config
# on allnoconfig (everything the guest uses built in, nothing else; no
# modules), its ELF vmlinux booted by qemu through the PVH entry, with the
# patches images/kernel/*.patch applied (in name order). Cached by the
# source package's version, the config and the patches.
kconfig=images/kernel/guest.config
kpatches=(images/kernel/*.patch)
ksrc=/usr/src/linux-source-6.1.tar.xz
kpkg="linux-source-6.1 $(dpkg-query -W -f='${Version}' linux-source-6.1)"
kkey="$( (echo "$kpkg"; cat "$kconfig" "${kpatches[@]}") | sha256sum | cut -c1-16)"
kcache="$(realpath -m "${KERNEL_CACHE:-.service/kernel-cache}")/$kkey"
if [[ ! -f "$kcache/vmlinux" ]]; then
	echo "images: building the guest kernel ($kpkg, $kconfig) into $kcache" >&2
	kstart=$SECONDS
	kbuild="$kcache.build.$$"
	rm -rf "$kbuild"
	mkdir -p "$kbuild"
	tar -C "$kbuild" -xJf "$ksrc"
	ktree="$(echo "$kbuild"/linux-source-*)"
	for p in "${kpatches[@]}"; do
		patch -s -p1 -d "$ktree" <"$p"
	done
	nice make -C "$ktree" -s allnoconfig KCONFIG_ALLCONFIG="$(realpath "$kconfig")" >"$kbuild/config.log" 2>&1
	# An option the config names but Kconfig dropped (a dependency
	# missing from the config) is an error, not a smaller kernel.
	missing=()
	for opt in $(grep -E '^CONFIG_[A-Z0-9_]+=' "$kconfig"); do
		grep -qxF "$opt" "$ktree/.config" || missing+=("$opt")
	done
	if ((${#missing[@]})); then
		echo "images: $kconfig: not in the kernel's config (a dependency missing?): ${missing[*]}" >&2
		rm -rf "$kbuild"
		exit 1
	fi
	if ! nice make -C "$ktree" -s -j"$(nproc)" vmlinux >"$kbuild/build.log" 2>&1; then
		tail -n 30 "$kbuild/build.log" >&2
		echo "images: the guest kernel did not build (log above; tree kept in $kbuild)" >&2
		exit 1
	fi
	mkdir -p "$kcache"
	cp "$ktree/.config" "$kcache/config"
	make -C "$ktree" -s kernelrelease >"$kcache/release"
	mv "$ktree/vmlinux" "$kcache/vmlinux.tmp"
	mv "$kcache/vmlinux.tmp" "$kcache/vmlinux"
	rm -rf "$kbuild"
	echo "images: guest kernel built in $((SECONDS - kstart)) s" >&2
fi
cp "$kcache/vmlinux" "$work/vmlinux"
krelease="$(cat "$kcache/release")"

root="$work/root"
mkdir -p "$root"/{bin,sbin,etc/compute-guest,proc,sys,dev,run,tmp,root,mnt,lib64,usr/lib}
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$root/init" ./cmd/compute-guest
# busybox: Debian's dynamically linked build (package busybox, fetched
# with apt-get download and unpacked here: it conflicts with
# busybox-static on the host). Its ash looks commands up in PATH, where
# busybox-static's runs its own applets first: the image's /bin/wget must
# stand in for the wget applet, which dies of SIGSEGV on -T (Debian builds
# it without the timeout feature yet parses -T into a null pointer; exit
# 139): images/files/wget takes -T itself.
(cd "$work" && apt-get download -qq busybox 2>/dev/null) ||
	(apt-get update -qq && cd "$work" && apt-get download -qq busybox)
dpkg-deb -x "$work"/busybox_*.deb "$work/busybox"
cp "$work/busybox/bin/busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
	[[ -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
done
rm -f "$root/bin/wget"
install -m 0755 images/files/wget "$root/bin/wget"
# mkfs.ext4 from e2fsprogs; the libraries both link (glibc).
cp "$(command -v mke2fs)" "$root/sbin/mke2fs"
ln -sf mke2fs "$root/sbin/mkfs.ext4"
for lib in $( (ldd "$(command -v mke2fs)"; ldd "$root/bin/busybox") | grep -o '/[^ ]*' | sort -u); do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
# Name resolution for busybox's wget, nc and nslookup: the files and dns
# sources are built into glibc, so with this nsswitch.conf nothing is
# dlopened. compute-guest writes resolv.conf from the VM's network
# (compute.net=); images/netcheck.sh boots the image on a tap and runs the
# tools.
printf 'hosts: files dns\nnetworks: files\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
: >"$root/etc/resolv.conf"
echo "minimal" >"$root/etc/hostname"

# The image's own kernel has its drivers built in: the kernel+initrd
# image's initramfs is packed here, with an empty module list.
echo "# none: the guest kernel has its drivers built in (images/kernel/guest.config)" >"$root/etc/compute-guest/modules"
(cd "$root" && find . -mindepth 1 | sort | cpio --quiet -o -H newc -R 0:0) >"$work/initramfs.cpio"

# The disk images boot the Debian cloud kernel (below), whose virtio
# drivers are modules: their initramfs carries them.
# The modules compute-guest loads at boot, dependencies first (from
# modules.dep), one per line: the path and the condition under which it is
# loaded (internal/guest moduleWanted: "pci" on a machine with a PCI bus,
# "virtio:1" with a virtio network card; none always). A dependency takes
# the condition of the first module that needs it, so the unconditional
# ones come first.
want=(virtio_mmio:: virtio_blk:: virtio_console:: virtio_pci::pci virtio_net::virtio:1)
declare -A seen=()
order=()
add() { # $1: a path relative to $mods as modules.dep names it, $2: its condition
	[[ -n "${seen[$1]:-}" ]] && return
	seen[$1]=1
	local deps
	deps="$(grep -E "^$1:" "$mods/modules.dep" | cut -d: -f2)"
	for d in $deps; do add "$d" "$2"; done
	order+=("$1 $2")
}
for w in "${want[@]}"; do
	m="${w%%::*}"
	path="$(grep -E "/$m\.ko(\.[a-z]+)?:" "$mods/modules.dep" | cut -d: -f1 || true)"
	[[ -n "$path" ]] && add "$path" "${w#*::}"
done
: >"$root/etc/compute-guest/modules"
for line in "${order[@]}"; do
	p="${line%% *}"
	mkdir -p "$root/lib/modules/$kver/$(dirname "$p")"
	cp "$mods/$p" "$root/lib/modules/$kver/$p"
	echo "/lib/modules/$kver/$line" | sed 's/ $//' >>"$root/etc/compute-guest/modules"
done

(cd "$root" && find . -mindepth 1 | sort | cpio --quiet -o -H newc -R 0:0) >"$work/initramfs-modules.cpio"
mv "$work/vmlinux" "$out/minimal/vmlinux"
mv "$work/initramfs.cpio" "$out/minimal/initramfs.cpio"

# The kernel command line of the image's own kernel: the serial console,
# quiet (printing to a serial port under emulation is slow), and the local
# APIC timer's frequency (lapic_timer_period=, bus clocks per jiffy: the
# parameter images/kernel/lapic-timer-period.patch adds), which qemu's APIC
# timer counts at 1 GHz under TCG and KVM alike: the kernel then skips the
# 100 ms loop that calibrates the timer at every boot (a busy loop under
# TCG; with the TSC-deadline timer, as on KVM, it is not run anyway). The
# random number generator trusts the CPU (CONFIG_RANDOM_TRUST_CPU) and IPv6
# is not built (images/kernel/guest.config): neither needs a word here.
# no_timer_check skips the kernel's check that the IO-APIC timer ticks
# within a few jiffies of wall time: on a host busy enough to starve an
# emulated CPU the check fails and the kernel panics ("IO-APIC + timer
# doesn't work!"), as it did for a disk-image VM in CI. Cloud images boot
# their guests with it for the same reason.
hz="$(sed -n 's/^CONFIG_HZ=//p' "$kcache/config")"
cmdline="console=ttyS0 quiet no_timer_check lapic_timer_period=$((1000000000 / hz))"
# The Debian kernel's (disk images): crypto self-tests and two slow
# initcalls this image does not use are skipped (about 0.4 s of a boot
# under emulation); no_timer_check as above.
diskcmdline="console=ttyS0 quiet no_timer_check cryptomgr.notests initcall_blacklist=crypto_kdf108_init,init_kprobe_trace"

sum="$(cat "$out/minimal/vmlinux" "$out/minimal/initramfs.cpio" | sha256sum | cut -d' ' -f1)"
size="$(($(stat -c %s "$out/minimal/vmlinux") + $(stat -c %s "$out/minimal/initramfs.cpio")))"
cat >"$out/minimal.json.tmp" <<JSON
{
  "id": "$id",
  "format": "kernel+initrd",
  "sizeBytes": $size,
  "sha256": "$sum",
  "location": "$out/minimal/vmlinux",
  "initrd": "$out/minimal/initramfs.cpio",
  "cmdline": "$cmdline",
  "description": "Minimal guest: Linux $krelease (Debian's source, images/kernel/guest.config), initramfs with compute-guest as init, busybox (wget, nc, ip, nslookup), mkfs.ext4"
}
JSON

# The same guest as disk images, for the q35 machine and its firmware: a
# FAT disk that syslinux boots (no partition table: SeaBIOS runs the
# filesystem's boot sector), holding the cloud kernel's bzImage and the
# initramfs with its modules. They show a disk image with compute-guest end
# to end (docs/images.md); an operator's own disk carries GRUB or extlinux.
printf 'DEFAULT guest\nPROMPT 0\nTIMEOUT 0\nLABEL guest\n  KERNEL vmlinuz\n  APPEND initrd=initrd.img %s\n' "$diskcmdline" >"$work/syslinux.cfg"
disk="$work/disk.raw"
mkfs.vfat -C "$disk" 32768 >/dev/null
mcopy -i "$disk" "$vmlinuz" ::vmlinuz
mcopy -i "$disk" "$work/initramfs-modules.cpio" ::initrd.img
mcopy -i "$disk" "$work/syslinux.cfg" ::syslinux.cfg
syslinux --install "$disk"
qemu-img convert -O qcow2 "$disk" "$work/disk.qcow2"
mv "$disk" "$out/minimal/disk.raw"
mv "$work/disk.qcow2" "$out/minimal/disk.qcow2"
for format in raw qcow2; do
	f="$out/minimal/disk.$format"
	cat >"$out/minimal-$format.json.tmp" <<JSON
{
  "id": "$id-$format",
  "format": "$format",
  "sizeBytes": $(stat -c %s "$f"),
  "sha256": "$(sha256sum "$f" | cut -d' ' -f1)",
  "location": "$f",
  "description": "The minimal guest as a $format disk booted by firmware (syslinux, Debian cloud kernel $kver)"
}
JSON
	mv "$out/minimal-$format.json.tmp" "$out/minimal-$format.json"
done

# The kernel+initrd manifest last: its presence means the build finished.
mv "$out/minimal.json.tmp" "$out/minimal.json"
echo "images: $id -> $out/minimal.json ($((size / 1024 / 1024)) MiB), $id-raw, $id-qcow2"
