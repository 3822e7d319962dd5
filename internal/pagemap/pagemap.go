// Package pagemap reads /proc/self/pagemap (Documentation/admin-guide/mm/
// pagemap.rst): whether a virtual page of this process has a present
// page-table entry, which tests use to tell the application's mappings from
// the NIC's.
package pagemap

import (
	"encoding/binary"
	"fmt"
	"os"
)

// pageShift is the log2 of the 4 KiB base page that pagemap indexes by.
const pageShift = 12

// Present reports whether the page holding addr (a virtual address of
// this process) has a present page-table entry now: bit 63 of its 64-bit
// pagemap entry. A page that is resident in a file but not mapped here
// is not present. Errors: /proc/self/pagemap cannot be read.
func Present(addr uint64) (bool, error) {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return false, fmt.Errorf("pagemap: %w", err)
	}
	defer f.Close()
	var v [8]byte
	if _, err := f.ReadAt(v[:], int64(addr>>pageShift)*8); err != nil {
		return false, fmt.Errorf("pagemap: entry of %#x: %w", addr, err)
	}
	return binary.LittleEndian.Uint64(v[:])>>63 != 0, nil
}
