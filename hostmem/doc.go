// Package hostmem is the host side of registered memory: pinning (mlock with
// a prefault, page reference counts so overlapping registrations nest, and
// accounting against a pin limit the way the kernel's ib_umem_get does),
// memfd-backed buffers that the application and the NIC map together, and
// the address space that tells a translation table which NIC-side frame
// backs an application page.
//
// Later issues add page migration (switching an application mapping to new
// memfd pages with MAP_FIXED) and notifiers (the mmu_interval_notifier
// analogue) here; see docs/memory.md.
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
