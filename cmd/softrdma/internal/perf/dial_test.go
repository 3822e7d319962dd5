package perf

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDialRefusedUntilDeadlineSaysRefused: a client with
// --connect-timeout whose every attempt was refused reports the refusal
// and the retrying, also when the deadline passed during the last
// attempt: a refusal that came back only after the deadline (a loaded
// host), or an attempt that the deadline cut after earlier refusals. It
// said "no answer ... (its host is down, or a firewall drops the
// connection)", though the server's host had answered every SYN
// (TestRefusedAfterConnectTimeoutSaysItRetried failed so in a new-user
// pass). A SYN unanswered from the first attempt still says no answer.
func TestDialRefusedUntilDeadlineSaysRefused(t *testing.T) {
	const addr = "127.0.0.1:18515"
	refused := fmt.Errorf("dial tcp %s: connect: %w", addr, syscall.ECONNREFUSED)
	for _, tc := range []struct {
		name string
		// attempt is the n-th attempt (from 0), given its context.
		attempt func(ctx context.Context, n int) error
		want    string
	}{
		{"refusal after the deadline", func(ctx context.Context, n int) error {
			if n > 0 {
				<-ctx.Done()
			}
			return refused
		}, "connection refused (still, after retrying for --connect-timeout 300ms: is the server running on port 18515?)"},
		{"cut after refusals", func(ctx context.Context, n int) error {
			if n > 0 {
				<-ctx.Done()
				return fmt.Errorf("dial tcp %s: %w", addr, ctx.Err())
			}
			return refused
		}, "connection refused (still, after retrying for --connect-timeout 300ms: is the server running on port 18515?)"},
		{"never answered", func(ctx context.Context, n int) error {
			<-ctx.Done()
			return fmt.Errorf("dial tcp %s: %w", addr, ctx.Err())
		}, "no answer from 127.0.0.1:18515 within --connect-timeout 300ms (its host is down, or a firewall drops the connection)"},
	} {
		synctest.Test(t, func(t *testing.T) {
			n := 0
			fake := func(ctx context.Context, network, a string) (net.Conn, error) {
				defer func() { n++ }()
				return nil, tc.attempt(ctx, n)
			}
			_, err := dialWith(context.Background(), fake, addr, 300*time.Millisecond)
			require.Error(t, err, tc.name)
			assert.Contains(t, err.Error(), tc.want, tc.name)
		})
	}
}
