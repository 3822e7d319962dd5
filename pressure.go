package softrdma

import (
	"errors"
	"fmt"
	"time"

	"github.com/softrdma/softrdma/placement"
)

// PressureRequest is what the host asks of the application when it wants
// pinned memory back (the memory-pressure upcall).
type PressureRequest struct {
	Bytes  int64  // bytes the host wants unpinned
	Pinned int64  // bytes the device has pinned when asking
	Limit  int64  // the pin limit in force after the request (-1: none)
	Reason string // "limit lowered" or "requested"
}

// PressureAnswer is the application's answer: what it says it gave back
// (by deregistering MRs, or re-registering them on demand) and anything it
// wants reported.
type PressureAnswer struct {
	Released int64 // bytes the application says it released
	Note     string
}

// PressureReport is one upcall: the request, the answer, and the bytes
// the device really got back (pinned before minus pinned after).
type PressureReport struct {
	Request       PressureRequest
	Answer        PressureAnswer
	BytesReturned int64
	Duration      time.Duration // the handler's run time
	Answered      bool          // a handler was set and ran
}

// ErrPressureUnmet: after the upcall the device still has more pinned
// than the limit (the application gave back too little, or no handler is
// set). Registrations fail with the pin limit until memory is released.
var ErrPressureUnmet = errors.New("softrdma: memory pressure: the application gave back less than asked")

// SetPressureHandler installs the application's memory-pressure handler:
// the device calls it (on the goroutine of SetPinLimit or
// RequestPinnedBytes, never on the data path) with the bytes it wants
// back; the handler decides which MRs to deregister or convert to ODP, and
// answers. nil removes it.
func (d *Device) SetPressureHandler(h func(PressureRequest) PressureAnswer) {
	d.pressure.Lock()
	d.pressure.h = h
	d.pressure.Unlock()
}

// SetPinLimit changes the device's pin limit at run time (bytes; 0: the
// RLIMIT_MEMLOCK rule). If more is pinned than the new limit, the
// pressure handler is asked for the difference. The report says what was
// asked, answered and returned; ErrPressureUnmet when the device is still
// over the limit afterwards; EINVAL for a negative limit (nothing changes).
func (d *Device) SetPinLimit(limit int64) (PressureReport, error) {
	if limit < 0 {
		return PressureReport{}, fmt.Errorf("softrdma: set pin limit %d: negative: %w", limit, placement.ErrInvalid)
	}
	d.place.Pins().SetLimit(limit)
	pinned := d.place.PinnedBytes()
	if limit == 0 || pinned <= limit {
		return PressureReport{Request: PressureRequest{Pinned: pinned, Limit: d.place.PinLimit(), Reason: "limit lowered"}}, nil
	}
	return d.upcall(PressureRequest{Bytes: pinned - limit, Pinned: pinned, Limit: limit, Reason: "limit lowered"})
}

// RequestPinnedBytes asks the application, through the pressure handler,
// to give back n bytes of pinned memory (the host wants them for
// something else); the limit does not change. The report says what was
// asked, answered and returned; ErrPressureUnmet when less than n came
// back; EINVAL for n <= 0 (no upcall).
func (d *Device) RequestPinnedBytes(n int64) (PressureReport, error) {
	if n <= 0 {
		return PressureReport{}, fmt.Errorf("softrdma: request pinned bytes: %d: not positive: %w", n, placement.ErrInvalid)
	}
	return d.upcall(PressureRequest{Bytes: n, Pinned: d.place.PinnedBytes(), Limit: d.place.PinLimit(), Reason: "requested"})
}

func (d *Device) upcall(req PressureRequest) (PressureReport, error) {
	d.pressure.Lock()
	h := d.pressure.h
	d.pressure.Unlock()
	rep := PressureReport{Request: req}
	if h != nil {
		start := time.Now()
		rep.Answer = h(req)
		rep.Duration = time.Since(start)
		rep.Answered = true
	}
	rep.BytesReturned = req.Pinned - d.place.PinnedBytes()
	if rep.BytesReturned < req.Bytes {
		return rep, fmt.Errorf("%w: asked %d bytes, got %d back", ErrPressureUnmet, req.Bytes, rep.BytesReturned)
	}
	return rep, nil
}
