package perf

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPatternIsDeterministicAndDiffersPerMessage(t *testing.T) {
	a, b, c := make([]byte, 1001), make([]byte, 1001), make([]byte, 1001)
	fillPattern(a, 7, 3)
	fillPattern(b, 7, 3)
	fillPattern(c, 7, 4)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, c)
	fillPattern(c, 8, 3)
	assert.NotEqual(t, a, c)
	// A prefix of a longer message is the shorter message.
	short := make([]byte, 13)
	fillPattern(short, 7, 3)
	assert.Equal(t, a[:13], short)
}

func TestCheckerReportsFirstDifference(t *testing.T) {
	c := checker{seed: 1}
	data := make([]byte, 10000)
	fillPattern(data, 1, 42)
	require.NoError(t, c.check(data, 42, "message 42"))
	data[5000] ^= 0xff
	data[7000] ^= 0xff
	err := c.check(data, 42, "message 42")
	var me *MismatchError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, int64(5000), me.Offset)
	assert.Equal(t, int64(42), me.Message)
	assert.True(t, errors.Is(err, ErrMismatch))
	assert.Contains(t, err.Error(), "message 42 differs at byte offset 5000")
	// The wrong message number is caught too.
	fillPattern(data, 1, 42)
	assert.Error(t, c.check(data, 43, "message 43"))
}

func TestFirstDiff(t *testing.T) {
	a := bytes.Repeat([]byte{1}, 9000)
	b := bytes.Clone(a)
	assert.Equal(t, -1, firstDiff(a, b))
	b[8999] = 2
	assert.Equal(t, 8999, firstDiff(a, b))
	b[0] = 2
	assert.Equal(t, 0, firstDiff(a, b))
	assert.Equal(t, -1, firstDiff(nil, nil))
}

func TestFileSourceAndSink(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	content := make([]byte, 10_000)
	fillPattern(content, 3, 0)
	require.NoError(t, os.WriteFile(in, content, 0o600))
	f, err := os.Open(in)
	require.NoError(t, err)
	defer f.Close()

	const size = 4096
	src := newFileSource(f, int64(len(content)))
	var out bytes.Buffer
	snk := newFileSink(&out)
	n := chunks(int64(len(content)), size)
	assert.Equal(t, int64(3), n)
	slot := make([]byte, size)
	for k := range n {
		m, err := src.fill(k, slot)
		require.NoError(t, err)
		assert.Equal(t, chunkLen(k, int64(len(content)), size), m)
		require.NoError(t, snk.consume(k, slot[:m]))
	}
	require.NoError(t, snk.flush())
	assert.Equal(t, content, out.Bytes())
	sum := sha256.Sum256(content)
	assert.Equal(t, hex.EncodeToString(sum[:]), src.sum())
	assert.Equal(t, src.sum(), snk.sum())
	assert.Equal(t, int64(len(content)), snk.n)
	// Out of order is an error at the sink.
	assert.Error(t, snk.consume(7, nil))
}

func TestChunks(t *testing.T) {
	assert.Equal(t, int64(0), chunks(0, 4096))
	assert.Equal(t, int64(1), chunks(1, 4096))
	assert.Equal(t, int64(1), chunks(4096, 4096))
	assert.Equal(t, int64(2), chunks(4097, 4096))
	assert.Equal(t, 1, chunkLen(1, 4097, 4096))
	assert.Equal(t, 4096, chunkLen(0, 4097, 4096))
}

func TestLoadByte(t *testing.T) {
	b, err := allocBuffer(100)
	require.NoError(t, err)
	defer freeBuffer(b)
	assert.Len(t, b, pageSize)
	for i := range 8 {
		b[i] = byte(0x10 + i)
	}
	for i := range 8 {
		assert.Equal(t, byte(0x10+i), loadByte(b, i), i)
	}
	b[pageSize-1] = 0xee
	assert.Equal(t, byte(0xee), loadByte(b, pageSize-1))
}
