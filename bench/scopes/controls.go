package scopes

import (
	"fmt"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/hostmem"
)

// Names of the control runs (Config.Controls).
const (
	SuspendOnly = "suspend-only"
	MigrateOnly = "migrate-only"
)

// controlSet is the control runs and the memory the migrate-only run
// moves.
type controlSet struct {
	rows []*remapRun
	as   *hostmem.AddressSpace
	pin  *hostmem.FramePin
}

// controls builds the two control runs. Their reports reuse
// RemapReport's fields: suspend-only's CriticalUs is Suspend plus Resume
// and its counts are the suspension's; migrate-only's PrecopyUs is the
// copy of every page and CriticalUs the Commit (nothing re-copied).
func (b *bed) controls() (*controlSet, error) {
	c := &controlSet{}
	mr := b.mrs[0]
	c.rows = append(c.rows, &remapRun{label: SuspendOnly, policy: softrdma.PolicyHold, op: func() (softrdma.RemapReport, error) {
		t0 := time.Now()
		s, err := b.b.Suspend(softrdma.ScopeMR, mr, softrdma.PolicyHold)
		if err != nil {
			return softrdma.RemapReport{}, err
		}
		sr, err := b.b.Resume(s)
		return softrdma.RemapReport{Requested: s.Requested, Scope: s.Scope, Widened: s.Widened,
			CriticalUs: float64(time.Since(t0).Nanoseconds()) / 1e3, QPsPaused: sr.QPsPaused,
			PacketsHeld: sr.Held, PacketsNAKed: sr.NAKed, PacketsDropped: sr.Dropped, BytesDelayed: sr.BytesDelayed}, err
	}})

	var err error
	if c.as, err = hostmem.NewAddressSpace(hostmem.Config{Size: int64(4 * b.cfg.MRSize)}); err != nil {
		return nil, fmt.Errorf("scopes: control: %w", err)
	}
	buf, err := c.as.Alloc(b.cfg.MRSize)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("scopes: control: %w", err)
	}
	clear(buf)
	addr := hostmem.AddrOf(buf)
	if b.cfg.Kind == Pinned {
		if c.pin, err = c.as.Pin(hostmem.NewPinAccount(0), addr, len(buf), true); err != nil {
			c.close()
			return nil, fmt.Errorf("scopes: control: %w", err)
		}
	}
	c.rows = append(c.rows, &remapRun{label: MigrateOnly, policy: softrdma.PolicyHold, op: func() (softrdma.RemapReport, error) {
		var m *hostmem.Migration
		var err error
		if c.pin != nil {
			m, err = c.pin.PrepareMigrate()
		} else {
			m, err = c.as.PrepareMigrate(addr, len(buf)/hostmem.PageSize)
		}
		if err != nil {
			return softrdma.RemapReport{}, err
		}
		t0 := time.Now()
		for i := range m.Pages() {
			m.CopyPage(i)
		}
		t1 := time.Now()
		if err := m.Commit(func(*hostmem.Migration) error { return nil }); err != nil {
			return softrdma.RemapReport{}, err
		}
		t2 := time.Now()
		m.Release()
		return softrdma.RemapReport{PrecopyUs: float64(t1.Sub(t0).Nanoseconds()) / 1e3,
			CriticalUs: float64(t2.Sub(t1).Nanoseconds()) / 1e3, PagesMoved: m.Pages()}, nil
	}})
	return c, nil
}

func (c *controlSet) close() {
	if c.pin != nil {
		_ = c.pin.Unpin()
	}
	if c.as != nil {
		_ = c.as.Close()
	}
}
