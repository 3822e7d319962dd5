package placement

import (
	"testing"

	"github.com/softrdma/softrdma/stag"
)

// BenchmarkLookupTranslate is the per-packet cost of finding the bytes: the
// four-check key lookup, the bounds check and the translation of a 64-byte
// range to its frame.
func BenchmarkLookupTranslate(b *testing.B) {
	e := New(Config{})
	buf := make([]byte, 1<<20)
	mr, err := e.RegMR(1, buf, stag.AccessLocalWrite|stag.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer e.DeregMR(mr)
	key, va := stag.STag(mr.RKey()), mr.Addr()+5*4096+100
	b.ReportAllocs()
	for b.Loop() {
		ent, r := e.mrs.Lookup(1, key, stag.AccessRemoteWrite)
		if r != stag.OK || ent.CheckRange(va, 64) != stag.OK {
			b.Fatal("lookup failed")
		}
		if _, tr := ent.Value.table.Translate(va, 64, true); tr != 0 {
			b.Fatal("translate failed")
		}
	}
}
