package hostmem

import (
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// frameQuarantine is how many released frames wait before any is reused.
// Frames are reused first-in first-out, and not before this many more
// have been released, so that the frame a page just lost is never the one
// it (or anything) gets next: a page table that kept a stale frame then
// reads or writes the wrong memory, which tests see, rather than the right
// memory by luck. 4096 frames (16 MiB) costs nothing but address space:
// released frames hold no memory (their pages are punched out).
const frameQuarantine = 4096

// frameAllocator hands out the frames of an AddressSpace's memfd and keeps
// the pin counts that delay their release. It has its own lock, not the
// AddressSpace's mu, so that FramePin.Unpin may run inside an Invalidate
// callback (which runs under mu).
type frameAllocator struct {
	sync.Mutex
	capacity uint32 // frames in the pool
	next     uint32 // frames [next, capacity) were never handed out
	queue    []Frame
	head     int // queue[head:] are released frames, oldest first
	inUse    int // frames handed out and not released
	// pins counts the FramePins holding each pinned frame.
	pins map[Frame]int32
	// orphans are pinned frames that their page lost (Free): released at
	// their last unpin.
	orphans map[Frame]struct{}
}

func (a *frameAllocator) init(capacity uint32) {
	a.capacity = capacity
	a.pins = make(map[Frame]int32)
	a.orphans = make(map[Frame]struct{})
}

func (a *frameAllocator) queued() int { return len(a.queue) - a.head }

// alloc fills out with frames: released frames beyond the quarantine
// first, then never-used frames (contiguous), then the quarantine itself.
func (a *frameAllocator) alloc(out []Frame) error {
	a.Lock()
	defer a.Unlock()
	n := len(out)
	if n > a.queued()+int(a.capacity-a.next) {
		return fmt.Errorf("%w: %d frames asked for, %d free", ErrNoFrames, n, a.queued()+int(a.capacity-a.next))
	}
	i := 0
	for ; i < n && a.queued() > frameQuarantine; i++ {
		out[i] = a.pop()
	}
	for ; i < n && a.next < a.capacity; i++ {
		out[i] = Frame(a.next)
		a.next++
	}
	for ; i < n; i++ {
		out[i] = a.pop()
	}
	a.inUse += n
	return nil
}

func (a *frameAllocator) pop() Frame {
	f := a.queue[a.head]
	a.head++
	if a.head == len(a.queue) {
		a.queue, a.head = a.queue[:0], 0
	} else if a.head >= 1024 && a.head*2 >= len(a.queue) {
		a.queue = a.queue[:copy(a.queue, a.queue[a.head:])]
		a.head = 0
	}
	return f
}

// release gives frames back: their memory is returned to the system with a
// hole punch (so that a frame handed out again reads zeros) before they
// join the queue. Pinned frames become orphans instead.
func (a *frameAllocator) release(s *AddressSpace, frames []Frame) {
	a.Lock()
	defer a.Unlock()
	free := frames[:0:0]
	for _, f := range frames {
		if a.pins[f] > 0 {
			a.orphans[f] = struct{}{}
			continue
		}
		free = append(free, f)
	}
	a.releaseLocked(s, free)
}

func (a *frameAllocator) releaseLocked(s *AddressSpace, frames []Frame) {
	if len(frames) == 0 {
		return
	}
	if !s.closed.Load() {
		forFrameRuns(frames, func(f Frame, n int) {
			// A failed punch leaves the old bytes in the frames; a frame
			// handed out must read zeros, so these are never reused.
			if err := unix.Fallocate(s.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
				int64(f)<<PageShift, int64(n)<<PageShift); err != nil {
				return
			}
			for k := range n {
				a.queue = append(a.queue, f+Frame(k))
			}
		})
	}
	a.inUse -= len(frames)
}

// pin adds a pin reference to each frame.
func (a *frameAllocator) pin(frames []Frame) {
	a.Lock()
	defer a.Unlock()
	for _, f := range frames {
		a.pins[f]++
	}
}

// unpin drops a pin reference from each frame and releases the orphans
// that no pin holds any more.
func (a *frameAllocator) unpin(s *AddressSpace, frames []Frame) {
	a.Lock()
	defer a.Unlock()
	var free []Frame
	for _, f := range frames {
		switch c := a.pins[f]; {
		case c <= 0:
			panic("hostmem: unpin of a frame that is not pinned")
		case c == 1:
			delete(a.pins, f)
			if _, ok := a.orphans[f]; ok {
				delete(a.orphans, f)
				free = append(free, f)
			}
		default:
			a.pins[f] = c - 1
		}
	}
	a.releaseLocked(s, free)
}

// pinned reports whether any of frames is pinned.
func (a *frameAllocator) pinned(frames []Frame) bool {
	a.Lock()
	defer a.Unlock()
	for _, f := range frames {
		if a.pins[f] > 0 {
			return true
		}
	}
	return false
}

// pinnedOnce reports whether every frame is held by exactly one pin.
func (a *frameAllocator) pinnedOnce(frames []Frame) bool {
	a.Lock()
	defer a.Unlock()
	for _, f := range frames {
		if a.pins[f] != 1 {
			return false
		}
	}
	return true
}

func (a *frameAllocator) pinnedFrames() int {
	a.Lock()
	defer a.Unlock()
	return len(a.pins)
}

func (a *frameAllocator) counts() (inUse, free, unused int) {
	a.Lock()
	defer a.Unlock()
	return a.inUse, a.queued(), int(a.capacity - a.next)
}

// forFrameRuns calls fn for each run of consecutive frame numbers.
func forFrameRuns(frames []Frame, fn func(f Frame, n int)) {
	for i := 0; i < len(frames); {
		j := i + 1
		for j < len(frames) && frames[j] == frames[j-1]+1 {
			j++
		}
		fn(frames[i], j-i)
		i = j
	}
}

// extents is a sorted list of free page runs [start, end), never adjacent:
// the free part of an AddressSpace's reservation. Guarded by the
// AddressSpace's mu.
type extents []extent

type extent struct{ start, end uintptr }

// take removes the first run of n free pages and returns its first page.
func (e *extents) take(n uintptr) (uintptr, bool) {
	for i, x := range *e {
		if x.end-x.start >= n {
			if x.end-x.start == n {
				*e = append((*e)[:i], (*e)[i+1:]...)
			} else {
				(*e)[i].start += n
			}
			return x.start, true
		}
	}
	return 0, false
}

// takeAt removes pages [p, p+n) if they are all free.
func (e *extents) takeAt(p, n uintptr) bool {
	for i, x := range *e {
		if x.start <= p && p+n <= x.end {
			switch {
			case x.start == p && x.end == p+n:
				*e = append((*e)[:i], (*e)[i+1:]...)
			case x.start == p:
				(*e)[i].start = p + n
			case x.end == p+n:
				(*e)[i].end = p
			default:
				*e = slices.Insert(*e, i+1, extent{p + n, x.end})
				(*e)[i].end = p
			}
			return true
		}
		if x.start > p {
			break
		}
	}
	return false
}

// put returns pages [p, p+n), which must not be free, merging neighbours.
func (e *extents) put(p, n uintptr) {
	i := 0
	for i < len(*e) && (*e)[i].start < p {
		i++
	}
	xs := *e
	mergePrev := i > 0 && xs[i-1].end == p
	mergeNext := i < len(xs) && xs[i].start == p+n
	switch {
	case mergePrev && mergeNext:
		xs[i-1].end = xs[i].end
		*e = append(xs[:i], xs[i+1:]...)
	case mergePrev:
		xs[i-1].end = p + n
	case mergeNext:
		xs[i].start = p
	default:
		*e = slices.Insert(xs, i, extent{p, p + n})
	}
}
