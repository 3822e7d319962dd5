package hostmem

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestBufferViewsShareMemory(t *testing.T) {
	b, err := Alloc(10000)
	require.NoError(t, err)
	app, nic := b.Bytes(), b.NIC()
	require.Len(t, app, 10000)
	require.Equal(t, 10000, cap(app))
	require.Len(t, nic, 10000)
	require.NotEqual(t, unsafe.Pointer(&app[0]), unsafe.Pointer(&nic[0]), "two mappings")
	require.Zero(t, uintptr(unsafe.Pointer(&app[0]))%PageSize)

	copy(app[4090:], "written by the application")
	require.Equal(t, "written by the application", string(nic[4090:4116]))
	copy(nic[9990:], "by the NIC")
	require.Equal(t, "by the NIC", string(app[9990:]))

	require.NoError(t, b.Hold())
	require.ErrorIs(t, b.Free(), ErrBufferBusy)
	b.Unhold()
	require.NoError(t, b.Free())
	require.ErrorIs(t, b.Free(), ErrBufferFreed)
	require.ErrorIs(t, b.Hold(), ErrBufferFreed)

	_, err = Alloc(0)
	require.Error(t, err)
}

func TestSpaceResolve(t *testing.T) {
	var s Space
	bufs := make([]*Buffer, 3)
	for i := range bufs {
		var err error
		bufs[i], err = Alloc((i + 1) * PageSize)
		require.NoError(t, err)
		require.NoError(t, s.Register(bufs[i]))
	}
	require.Error(t, s.Register(bufs[0]), "registered twice")

	for _, b := range bufs {
		app, nic := b.Bytes(), b.NIC()
		for _, off := range []int{0, 1, len(app) - 1} {
			got, owner := s.Resolve(unsafe.Pointer(&app[off]))
			require.Same(t, b, owner)
			require.Equal(t, unsafe.Pointer(&nic[off]), got)
		}
	}
	// Go memory, and a NIC view itself, resolve to themselves.
	heap := make([]byte, 100)
	got, owner := s.Resolve(unsafe.Pointer(&heap[5]))
	require.Nil(t, owner)
	require.Equal(t, unsafe.Pointer(&heap[5]), got)
	nic0 := unsafe.Pointer(&bufs[0].NIC()[0])
	got, owner = s.Resolve(nic0)
	require.Nil(t, owner)
	require.Equal(t, nic0, got)
	// A nil space is the identity.
	var nilSpace *Space
	got, owner = nilSpace.Resolve(unsafe.Pointer(&heap[0]))
	require.Nil(t, owner)
	require.Equal(t, unsafe.Pointer(&heap[0]), got)

	// Free unregisters.
	app1 := bufs[1].Bytes()
	p1 := unsafe.Pointer(&app1[0])
	require.NoError(t, bufs[1].Free())
	_, owner = s.Resolve(p1)
	require.Nil(t, owner)
	_, owner = s.Resolve(unsafe.Pointer(&bufs[2].Bytes()[0]))
	require.Same(t, bufs[2], owner)
	require.NoError(t, bufs[0].Free())
	require.NoError(t, bufs[2].Free())
	require.ErrorIs(t, s.Register(bufs[2]), ErrBufferFreed)
}
