package softrdma

import "github.com/softrdma/softrdma/placement"

// Engine returns the device's placement engine, for tests that hold a
// placement in flight (an unbound placement.Cursor between Begin and End).
func (d *Device) Engine() *placement.Engine { return d.place }

// Num returns the PD's number, as the placement engine knows it.
func (pd *PD) Num() uint32 { return pd.id }
