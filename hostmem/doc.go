// Package hostmem is the host side of registered memory: pinning (mlock with
// a prefault, page reference counts so overlapping registrations nest, and
// accounting against a pin limit the way the kernel's ib_umem_get does),
// memfd-backed buffers that the application and the NIC map together, and
// the address space that tells a translation table which NIC-side frame
// backs an application page.
//
// AddressSpace is the application's address space of demand paging
// (issue 3): memfd frames mapped both into a reserved application range and
// at fixed NIC addresses, with Alloc, Free (the munmap of this world),
// Protect, Migrate and Resolve, pinning through a PinAccount, and
// subscriptions in the manner of Linux's mmu_interval_notifier
// (invalidate callbacks, ReadBegin/ReadRetry with a sequence count). ODP
// tables, pins and migrations copy through the fixed NIC addresses, as a
// NIC's DMA reaches physical pages; the NIC never touches the application's
// page tables. See docs/memory.md, "Host address space and notifiers", for
// the protocol.
package hostmem

import "golang.org/x/sys/unix"

// Page geometry. softrdma runs on 4 KiB base pages (amd64, arm64 with 4 KiB
// pages); the translation tables use the same size.
const (
	PageShift = 12
	PageSize  = 1 << PageShift
	pageMask  = PageSize - 1
)

func init() {
	if unix.Getpagesize() != PageSize {
		panic("hostmem: the system page size is not 4096 bytes")
	}
}
