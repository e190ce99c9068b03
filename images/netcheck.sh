#!/usr/bin/env bash
# images/netcheck.sh [IMAGE_DIR]: boot the minimal image (default
# .service/images) under qemu (TCG) with a tap into a network namespace of
# its own, holding an HTTP and a DNS server, and run the guest's network
# tools: compute-guest addresses the card from compute.net=, then wget
# (by address, by name, and with -T, which once crashed busybox's wget),
# nc and nslookup must work. Root only; no
# packet leaves the namespace, which is deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
img="$(realpath "${1:-.service/images}")"
ns="cpimg-$$"
work="$(mktemp -d)"
ip netns add "$ns"
trap 'kill $(jobs -p) 2>/dev/null || true; ip netns del "$ns"; rm -rf "$work"' EXIT
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" ip tuntap add dev tap0 mode tap
ip netns exec "$ns" ip addr add 10.0.9.1/24 dev tap0
ip netns exec "$ns" ip link set tap0 up
echo hello-from-upstream >"$work/hello.txt"
(cd "$work" && exec ip netns exec "$ns" python3 -m http.server 8080 --bind 10.0.9.1 >/dev/null 2>&1) &
ip netns exec "$ns" python3 images/netcheck-dns.py 10.0.9.1 >/dev/null 2>&1 &
b64() { base64 -w0 | tr '+/' '-_' | tr -d '='; }
net=$(printf '{"mac":"52:54:00:00:09:02","address":"10.0.9.2/24","gateway":"10.0.9.1","dns":["10.0.9.1"]}' | b64)
ud=$(b64 <<'UD'
#!/bin/sh
exec >/dev/console 2>&1
echo NETCHECK-START
ip -4 addr show eth0; ip route
wget -q -O - http://10.0.9.1:8080/hello.txt && echo CHECK-wget-addr
wget -q -O - http://upstream.test:8080/hello.txt && echo CHECK-wget-name
wget -q -T 5 -O - http://upstream.test:8080/hello.txt && echo CHECK-wget-timeout
echo x | nc -w 2 10.0.9.1 8080 >/dev/null && echo CHECK-nc
nslookup upstream.test >/dev/null && echo CHECK-nslookup
echo NETCHECK-END
poweroff -f
UD
)
cmdline="$(sed -n 's/.*"cmdline": "\([^"]*\)".*/\1/p' "$img/minimal.json") compute.net=$net compute.userdata=$ud"
timeout 180 ip netns exec "$ns" qemu-system-x86_64 -M q35 -accel tcg -cpu max -m 256M -nodefaults -no-user-config \
	-display none -serial "file:$work/console.log" -kernel "$img/minimal/vmlinux" -initrd "$img/minimal/initramfs.cpio" \
	-append "$cmdline" -netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
	-device virtio-net-pci,netdev=n0,mac=52:54:00:00:09:02 || true
sed -n '/NETCHECK-START/,/NETCHECK-END/p' "$work/console.log"
for c in wget-addr wget-name wget-timeout nc nslookup; do
	grep -q "CHECK-$c" "$work/console.log" || { echo "netcheck: $c failed" >&2; exit 1; }
done
echo "netcheck: ok"
