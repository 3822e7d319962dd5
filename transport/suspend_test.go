package transport

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
)

// TestQPsPausedCountsEachQPOnce: a QP that the receive loop marked paused
// just after a Resume emptied the list (it read the old suspension's
// number first) is listed again when the next suspension pauses it; that
// suspension's report counted it twice (bench scopes once saw 3 QPs
// paused at mr scope, where 2 write the MR).
func TestQPsPausedCountsEachQPOnce(t *testing.T) {
	r := newResponderRig(t)
	s1, err := r.d.Suspend(placement.ScopeDevice, nil, PolicyHold)
	require.NoError(t, err)
	_, err = r.d.Resume(s1)
	require.NoError(t, err)
	r.d.markPaused(r.qp) // late: the receive loop read s1's number before the Resume
	s2, err := r.d.Suspend(placement.ScopeDevice, nil, PolicyHold)
	require.NoError(t, err)
	r.d.markPaused(r.qp)
	rep, err := r.d.Resume(s2)
	require.NoError(t, err)
	require.Equal(t, 1, rep.QPsPaused)
}
