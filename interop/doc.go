// Package interop runs softrdma against Linux Soft-RoCE (rdma_rxe) and the
// stock rdma-core tools: the rxe test bed (../shared/rxe-testbed) boots a
// Debian VM under qemu on a private bridge, a stock tool runs in it
// (ibv_rc_pingpong, ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw) and
// `softrdma` runs on the host side of the bridge as its peer, each side
// once as the server and once as the client, and two runs with packet
// loss injected on softrdma's side. One VM boot serves every run (TestRxe).
// After each run the tests read rxe's hw_counters in the VM and check that
// rxe accepted every packet softrdma sent (no silent ICRC drop) and saw no
// sequence error, and an independent checker recomputes the ICRC of every
// packet captured on the bridge.
//
// The package has tests only. They run when the test bed is available
// (root, qemu, the test bed built) and skip with a message otherwise;
// RXETB_INTEROP=1 makes a missing test bed an error, RXETB_INTEROP=0 skips,
// RXETB_UNAVAILABLE=reason (.ci/run, when it could not build the test bed)
// skips with that reason, RXETB_STEPS=regexp runs only some cases.
// See docs/interop.md and interop/run.sh.
package interop
