// Package interop runs softrdma against Linux Soft-RoCE (rdma_rxe) and the
// stock rdma-core tools: the rxe test bed (../shared/rxe-testbed) boots a
// Debian VM under qemu on a private bridge, a stock tool runs in it
// (ibv_rc_pingpong, ...) and `softrdma` runs on the host side of the
// bridge as its peer, each side once as the server and once as the client.
// After each run the tests read rxe's hw_counters in the VM and check that
// rxe accepted every packet softrdma sent (no silent ICRC drop) and saw no
// sequence error, and an independent checker recomputes the ICRC of every
// packet captured on the bridge.
//
// The package has tests only. They run when the test bed is available
// (root, qemu, the test bed built) and skip with a message otherwise;
// RXETB_INTEROP=1 makes a missing test bed an error, RXETB_INTEROP=0 skips.
// See docs/interop.md and interop/run.sh.
package interop
