package pagemap

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A fresh anonymous mapping has no present entry until it is written, and
// one after.
func TestPresent(t *testing.T) {
	b, err := unix.Mmap(-1, 0, 2<<pageShift, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(b)
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	p, err := Present(addr)
	require.NoError(t, err)
	require.False(t, p, "not touched")
	b[1<<pageShift] = 1
	p, err = Present(addr + 1<<pageShift)
	require.NoError(t, err)
	require.True(t, p, "written")
	p, err = Present(addr)
	require.NoError(t, err)
	require.False(t, p, "the other page is still untouched")
}
