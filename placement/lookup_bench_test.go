package placement

import (
	"testing"

	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// BenchmarkLookupTranslate is the per-packet cost of finding the bytes: the
// four-check key lookup (key, PD, access, valid state), the overflow-safe
// bounds check and the translation of a 64-byte range to its frame, as the
// data path makes them: one read of the key's slot, and the table's walk
// when the region is not mapped linearly (never here: a pinned Go slice).
func BenchmarkLookupTranslate(b *testing.B) {
	e := New(Config{})
	buf := make([]byte, 1<<20)
	mr, err := e.RegMR(1, buf, stag.AccessLocalWrite|stag.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer e.DeregMR(mr)
	key, va := stag.STag(mr.RKey()), mr.Addr()+5*4096+100
	want := &buf[5*4096+100]
	b.ReportAllocs()
	for b.Loop() {
		p, ent, r := e.mrs.LookupRange(1, key, stag.AccessRemoteWrite, va, 64)
		if r != stag.OK {
			b.Fatal("lookup failed")
		}
		if p == nil {
			var tr pagetable.Result
			if p, tr = ent.Value.table.Translate(va, 64, true); tr != pagetable.OK {
				b.Fatal("translate failed")
			}
		}
		if len(p) != 64 || &p[0] != want {
			b.Fatal("wrong frame")
		}
	}
}

// lookupFloor has the signature of stag.Table.LookupRange and does no work.
//
//go:noinline
func lookupFloor(t *stag.Table[*MR], pd uint32, key stag.STag, need stag.Access, iova, n uint64) ([]byte, *stag.Entry[*MR], stag.Reason) {
	return floorBytes, nil, stag.OK
}

var floorBytes = make([]byte, 64)

// BenchmarkLookupTranslateFloor is the harness alone: b.Loop and one call
// with LookupRange's arguments and results that does nothing. What
// BenchmarkLookupTranslate measures above it is the lookup's own work.
func BenchmarkLookupTranslateFloor(b *testing.B) {
	e := New(Config{})
	b.ReportAllocs()
	for b.Loop() {
		p, _, r := lookupFloor(&e.mrs, 1, 0x101, stag.AccessRemoteWrite, 0x1000, 64)
		if r != stag.OK || len(p) != 64 {
			b.Fatal("floor failed")
		}
	}
}
