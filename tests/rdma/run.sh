#!/usr/bin/env bash
# The ib transport over real verbs: boots Debian's kernel under qemu (software
# emulation, no KVM needed), with this machine's root file system shared
# read-only so the host's build runs inside, creates two Soft-RoCE (rdma_rxe)
# devices on the two ends of a veth pair, and runs in one boot:
#   - the ib unit tests with devices present;
#   - the transport conformance suite's ib cases (tests/transport), which must run, not skip;
#   - loom_mp_tests' every-case sweep on 2 ranks at LOOM_MP_SUITE=transport (every
#     collective and root, at counts from 0 to 2^20+3, aligned and not, on a sample of the
#     types and ops: the kernels are the transports' own, and the full list took 48 s of the
#     emulated machine's time), with shared memory off, which LOOM_NET=IB moves onto ib; a rank
#     killed mid all-reduce, which the others must report; a rank with its own
#     host name killed, which only the ib link can reveal to the other;
#   - collectives from buffers registered with loomCommRegister, which must be
#     sent in place (the count of such sends is reported and must not be 0);
#   - loom-perf, every collective checked, on 2 and 4 ranks over ib (two rxe
#     devices: ranks 0 and 2 share one), then 2 ranks over TCP in the same VM.
# Then it reports on the host. Exit 77 (skip) when qemu, busybox, cpio or the
# kernel package are unavailable.
#
# usage: tests/rdma/run.sh BUILD_DIR
#   LOOM_RDMA_CACHE: where the kernel is kept (default BUILD_DIR/rdma-vm)
#   LOOM_RDMA_STEPS: run only these steps ("unit host_kill"); LOOM_RDMA_KEEP: copy results here
#   LOOM_RDMA_EXTRA: a command line to run in the guest as step "extra" (for investigations)
set -uo pipefail
BUILD=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${LOOM_RDMA_CACHE:-$BUILD/rdma-vm}
skip() { echo "SKIP: $*"; exit 77; }

for tool in qemu-system-x86_64 cpio; do
  command -v $tool >/dev/null || skip "$tool is not installed (scripts/setup.sh installs it)"
done
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x insmod >/dev/null ||
  skip "a static busybox is not installed (busybox-static)"
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || ls /usr/lib/*/libibverbs/librxe-* >/dev/null 2>&1 ||
  skip "the rxe verbs provider is not installed (ibverbs-providers)"
for b in tests/loom_mp_tests tests/loom_unit_tests tests/loom_fault_worker loom-perf; do
  [ -x "$BUILD/$b" ] || skip "$BUILD/$b is not built"
done

# The kernel: Debian's package, downloaded and unpacked, never installed.
mkdir -p "$CACHE"
if [ ! -d "$CACHE/kernel" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || skip "apt-cache knows no linux-image-amd64"
  (cd "$CACHE" && rm -f ./*.deb && apt-get download "$pkg" >/dev/null 2>&1) ||
    skip "cannot download $pkg (no package mirror reachable)"
  dpkg -x "$CACHE"/"$pkg"_*.deb "$CACHE/kernel.tmp" && rm -f "$CACHE"/*.deb &&
    mv "$CACHE/kernel.tmp" "$CACHE/kernel" || skip "cannot unpack $pkg"
fi
KV=$(ls "$CACHE/kernel/lib/modules" | head -1)
MODDIR=$CACHE/kernel/lib/modules/$KV
VMLINUZ=$CACHE/kernel/boot/vmlinuz-$KV

# The initramfs: busybox and the modules, loaded in dependency order. rdma_rxe
# also needs the crc32 modules, which modules.dep does not list.
MODS="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci 9pnet 9pnet_virtio
 netfs fscache 9p crc32_generic crc32-pclmul veth udp_tunnel ip6_udp_tunnel ib_core ib_uverbs
 rdma_rxe"
WORK=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
IRD=$WORK/initrd
mkdir -p "$IRD"/{bin,dev,proc,sys,newroot,mods}
cp /bin/busybox "$IRD/bin/"
for a in sh mount umount insmod switch_root mkdir; do ln -s busybox "$IRD/bin/$a"; done
for m in $MODS; do
  f=$(find "$MODDIR" -name "$m.ko" -o -name "$m.ko.xz" | head -1)
  [ -n "$f" ] || skip "module $m missing from $KV"
  case $f in *.xz) xz -dc "$f" > "$IRD/mods/$m.ko" ;; *) cp "$f" "$IRD/mods/" ;; esac
done
# Paths the guest needs writable or visible under its own /tmp: the work folder
# (read-write), the sources and the build (read-only) at their host paths.
cat > "$IRD/init" <<IEOF
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(echo $MODS); do insmod /mods/\$m.ko || echo "insmod \$m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hostroot /newroot || exec sh
mount -t tmpfs tmp /newroot/tmp; mount -t tmpfs run /newroot/run
for share in src:$SRC:ro build:$BUILD:ro work:$WORK:rw; do
  tag=\${share%%:*}; rest=\${share#*:}; path=\${rest%:*}; mode=\${rest##*:}
  mkdir -p /newroot\$path; mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,\$mode \$tag /newroot\$path
done
umount /proc /sys; mount --move /dev /newroot/dev
exec switch_root /newroot $WORK/guest.sh
IEOF
chmod +x "$IRD/init"
(cd "$IRD" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$WORK/initrd.gz")

# What runs inside (as PID 1): network, two rxe devices, the tests, power-off.
cat > "$WORK/guest.sh" <<GEOF
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp
mount -t proc proc /proc; mount -t sysfs sys /sys; mkdir -p /dev/shm; mount -t tmpfs shm /dev/shm
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.0.0.1/24 dev veth0; ip addr add 10.0.0.2/24 dev veth1
ip link set veth0 up; ip link set veth1 up
for i in all veth0 veth1; do
  echo 1 > /proc/sys/net/ipv4/conf/\$i/accept_local; echo 0 > /proc/sys/net/ipv4/conf/\$i/rp_filter
done
# Traffic between the two addresses must cross the veth, not the local table.
ip rule add pref 10 iif veth0 lookup local; ip rule add pref 11 iif veth1 lookup local
ip rule add pref 15 oif veth0 to 10.0.0.1 lookup local; ip rule add pref 16 oif veth1 to 10.0.0.2 lookup local
ip rule add pref 20 oif veth0 lookup main; ip rule add pref 21 oif veth1 lookup main
ip rule add pref 100 lookup local; ip rule del pref 0
rdma link add rxe0 type rxe netdev veth0 && rdma link add rxe1 type rxe netdev veth1
export R=$WORK
step() {  # name, timeout seconds, command...
  local name=\$1 t=\$2; shift 2
  case " ${LOOM_RDMA_STEPS:-\$name} " in *" \$name "*) ;; *) return ;; esac
  local s=\$(date +%s%N) rc try
  for try in 1 2; do
    timeout -k 5 \$t "\$@" > "\$R/\$name.log" 2>&1; rc=\$?
    # Loom's writes stay inside the FIFO the peer registered, yet the emulated
    # rxe device now and then ends one with "remote invalid request" (CI saw it
    # once, in a 3-rank all-reduce before any rank was killed). Such a step runs
    # once more, and the report names it.
    [ \$rc != 0 ] && [ \$try = 1 ] && grep -q "remote invalid request" "\$R/\$name.log" || break
    mv "\$R/\$name.log" "\$R/\$name.first.log"; echo "\$name" >> "\$R/reruns.txt"
  done
  echo "\$name \$rc \$(( (\$(date +%s%N) - s) / 1000000 ))" >> "\$R/steps.txt"
}
export LOOM_IB_HCA=rxe LOOM_TIMEOUT_MS=60000
echo "devices: \$(ls /sys/class/infiniband | tr '\n' ' ')" > "\$R/info.txt"
step unit 120 $BUILD/tests/loom_unit_tests --gtest_filter='Ib*'
conformance() {
  local out; out=\$($BUILD/tests/loom_transport_tests --gtest_filter='Ib/*' 2>&1); local rc=\$?
  echo "\$out"
  [ \$rc = 0 ] && ! echo "\$out" | grep -q '^\[  SKIPPED \]'
}
[ -x $BUILD/tests/loom_transport_tests ] &&
  step conformance 300 bash -c "\$(declare -f conformance); conformance"
LOOM_NET=IB LOOM_MP_SUITE=transport step collectives 600 $BUILD/tests/loom_mp_tests \
  --gtest_filter='Ranks/CollectivesTest.EveryCase/2ranks_tcp'
LOOM_NET=IB LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TRANSPORT LOOM_MP_VERBOSE=1 step registered 300 $BUILD/tests/loom_mp_tests \
  --gtest_filter='Ranks/RegisterTest.*net'
LOOM_NET=IB step rank_killed 300 $BUILD/tests/loom_mp_tests \
  --gtest_filter='Transports/PeerDeathTest.*/tcp'
# A rank on "another host" killed: each rank gets its own host name (a UTS
# namespace), so no rank can watch the other's pid; only the ib link can tell.
host_kill() {
  local logs=\$R/host_kill
  mkdir -p \$logs
  for r in 0 1; do
    LOOM_RANK=\$r LOOM_WORLD_SIZE=2 LOOM_COMM_ID=127.0.0.1:29555 LOOM_TIMEOUT_MS=30000 LOOM_NET=IB LOOM_DEBUG=${HOST_KILL_DEBUG:-WARN} LOOM_DEBUG_SUBSYS=INIT,TRANSPORT,EXEC \
      unshare -u sh -c "hostname vmhost\$r; exec $BUILD/tests/loom_fault_worker until-error" \
      > \$logs/rank\$r.log 2>&1 &
    eval pid\$r=\$!
  done
  for i in \$(seq 600); do
    grep -q READY \$logs/rank0.log && grep -q READY \$logs/rank1.log && break; sleep 0.1
  done
  sleep 2
  local victim=\$(sed -n 's/^READY rank 1 pid \([0-9]*\).*/\1/p' \$logs/rank1.log)
  local at=\$(date +%s%3N)
  kill -KILL \$victim
  wait \$pid0; local rc=\$?
  local line=\$(grep '^ERROR rank 0' \$logs/rank0.log)
  local failed=\$(echo "\$line" | sed -n 's/.*at_ms=\([0-9]*\).*/\1/p')
  echo "rank 0 exit \$rc, error \$(( \${failed:-0} - at )) ms after the kill: \$line"
  # Named, and well inside the 30 s timeout: the link found it, not the watchdog.
  [ \$rc = 0 ] && echo "\$line" | grep -q "rank 1" && [ \$(( \${failed:-0} - at )) -lt 10000 ]
}
step host_kill 120 bash -c "\$(declare -f host_kill); host_kill"
PERF="$BUILD/loom-perf -C all -b 8 -e 1M -f 16 -n 3 -w 1 -c 1"
LOOM_SHM_DISABLE=1 LOOM_NET=IB step perf_ib_2 300 \$PERF -np 2
LOOM_SHM_DISABLE=1 LOOM_NET=IB step perf_ib_4 600 \$PERF -np 4
LOOM_SHM_DISABLE=1 LOOM_NET=Socket step perf_tcp_2 300 \$PERF -np 2
LOOM_SHM_DISABLE=1 LOOM_NET=IB LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=INIT,TRANSPORT step ib_info 60 \
  $BUILD/loom-perf -np 2 -b 8 -e 8 -n 1 -w 0
[ -n "${LOOM_RDMA_EXTRA:-}" ] && step extra 300 bash -c '${LOOM_RDMA_EXTRA:-}'
echo done > "\$R/finished"
sync
echo o > /proc/sysrq-trigger; sleep 10
GEOF
chmod +x "$WORK/guest.sh"

echo "booting $KV under qemu (TCG); results in $WORK"
start=$(date +%s)
timeout 1500 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 3G -nographic -no-reboot \
  -nic none -kernel "$VMLINUZ" -initrd "$WORK/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$WORK",mount_tag=work,security_model=none,multidevs=remap \
  -virtfs local,path="$SRC",mount_tag=src,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$BUILD",mount_tag=build,security_model=none,readonly=on,multidevs=remap \
  > "$WORK/console.log" 2>&1
echo "VM ran $(( $(date +%s) - start )) s"

if [ ! -f "$WORK/finished" ]; then
  echo "FAIL: the guest did not finish; console:"; tail -40 "$WORK/console.log"
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done
  exit 1
fi
cat "$WORK/info.txt"
grep -h "ib: \|ready:" "$WORK/ib_info.log" 2>/dev/null | sed 's/^/  /' | head -4
fail=0
while read -r name rc secs; do
  printf '%-12s rc=%-3s %7s ms\n' "$name" "$rc" "$secs"
  [ "$rc" = 0 ] || { fail=1; echo "== $name (tail)"; tail -30 "$WORK/$name.log"; }
done < "$WORK/steps.txt"
for name in $(cat "$WORK/reruns.txt" 2>/dev/null); do
  echo "$name: rerun after the rxe device ended a write with \"remote invalid request\":"
  grep -m 2 "remote invalid request" "$WORK/$name.first.log" | sed 's/^/    /'
done
grep -h "after the kill" "$WORK/host_kill.log" 2>/dev/null | sed 's/^/  /'
zc=$(grep -ho "[0-9]* sends from registered buffers" "$WORK/registered.log" 2>/dev/null | awk '{s += $1} END {print s + 0}')
echo "  sends straight from registered user buffers: $zc"
[ -f "$WORK/registered.log" ] && [ "$zc" = 0 ] && { echo "FAIL: no send came from registered memory"; fail=1; }
grep -h "PASSED\|FAILED" "$WORK"/{unit,conformance,collectives,registered,rank_killed}.log 2>/dev/null | sed 's/^/  /'
for p in perf_ib_2 perf_tcp_2 perf_ib_4; do
  [ -f "$WORK/$p.log" ] || continue
  echo "== $p"; grep -E "^ +[0-9]+ +[0-9]+ +(float|int)|Avg bus|Out of bounds" "$WORK/$p.log" | head -60
done
[ -n "${LOOM_RDMA_KEEP:-}" ] && { cp -r "$WORK" "$LOOM_RDMA_KEEP"; echo "kept in $LOOM_RDMA_KEEP"; }
exit $fail
