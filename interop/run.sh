#!/usr/bin/env bash
# Interop suite: softrdma against Linux rxe and the stock rdma-core tools in
# the rxe test bed's VM (see docs/interop.md). For .ci/run or by hand, as root:
#
#   interop/run.sh                       # build the test bed if needed, run the suite
#   RXETB_SUITE=trixie interop/run.sh    # against kernel 6.12 / rdma-core 56 instead of 6.1 / 44
#   RXETB_STEPS=ib_atomic interop/run.sh # only the cases whose names match (one VM boot still)
#   interop/run.sh -race                 # extra arguments go to go test
#
# Environment: RXETB_DIR (test bed scripts, default ../shared/rxe-testbed
# next to the project), RXETB_CACHE (default /var/cache/rxe-testbed),
# RXETB_SUITE (bookworm|trixie; default: the last build).
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "interop/run.sh: needs root (network namespace, taps, qemu)" >&2; exit 2; }
export RXETB_DIR=${RXETB_DIR:-$(cd .. && pwd)/shared/rxe-testbed}
export RXETB_CACHE=${RXETB_CACHE:-/var/cache/rxe-testbed}
[ -x "$RXETB_DIR/build.sh" ] || { echo "interop/run.sh: no test bed in $RXETB_DIR (set RXETB_DIR)" >&2; exit 2; }

# Host tools the test bed needs beyond what its build.sh installs itself
# (qemu-system-x86, cpio, tcpdump, tshark): depmod (kmod) for the module
# tree, python3 for roce_pcap.py, bc for its scripts' timings, gcc for its
# rxetb-verbs (the README's list; .ci/run installs the same).
need=()
command -v depmod >/dev/null || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || need+=(kmod)
command -v python3 >/dev/null || need+=(python3)
command -v bc >/dev/null || need+=(bc)
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

out=out${RXETB_SUITE:+-$RXETB_SUITE}
if [ ! -f "$RXETB_CACHE/$out/kver" ]; then
    echo "== building the rxe test bed (${RXETB_SUITE:-host suite})"
    start=$(date +%s)
    PATH=$PATH:/usr/sbin:/sbin "$RXETB_DIR/build.sh"
    echo "   built in $(( $(date +%s) - start )) s"
fi

echo "== interop suite (go test ./interop)"
start=$(date +%s)
RXETB_INTEROP=1 go test -count=1 -v -timeout 10m "$@" ./interop
echo "== interop suite passed in $(( $(date +%s) - start )) s"
