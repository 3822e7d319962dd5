package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRPingSizeZeroRefused: rping -S 0 is refused in rping's words
// ("Invalid size 0 (valid range is 26 to 65535)", rping.c's getopt loop),
// as -S 25 is; it silently ran with the default 64, rping.Options taking
// 0 for the default. (A short context bounds a server that would wait.)
func TestRPingSizeZeroRefused(t *testing.T) {
	for _, args := range [][]string{
		{"rping", "-s", "-a", "127.0.0.1", "--bind", "127.0.0.1:0", "-S", "0"},
		{"rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.1:0", "-S", "0", "-C", "1", "--timeout", "1s"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var o, e bytes.Buffer
		code := run(ctx, args, &o, &e)
		cancel()
		assert.Equal(t, exitUsage, code, "%v: %s", args, e.String())
		assert.Equal(t, "softrdma: rping: Invalid size 0 (valid range is 26 to 65535)\n", e.String(), args)
	}
}
