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

// poolQuarantine is how many frames the migration pool keeps back: a
// pooled frame goes to a migration only once this many more have joined
// the pool after it, so that a range migrated again does not get back the
// frames it just lost (the same reason as frameQuarantine, for stale page
// table entries), as long as it is at most this big.
const poolQuarantine = 256

// DefaultFramePool is the most frames an AddressSpace's migration pool
// holds when Config.FramePool is 0: 16 MiB.
const DefaultFramePool = 4096

// frameAllocator hands out the frames of an AddressSpace's memfd and keeps
// the pin counts that delay their release. It has its own lock, not the
// AddressSpace's mu, so that FramePin.Unpin may run inside an Invalidate
// callback (which runs under mu).
//
// Besides the released frames (punched out, reading zeros) it keeps the
// migration pool: frames a migration gave back (the old frames at
// Release, the new ones at Abort) with their memory and their bytes, up to
// poolMax frames, handed to later migrations only. A migration overwrites
// every new frame with the copy of its page before anything can read it,
// so it needs neither zeros nor a hole punch, and it saves the population
// of fresh frames (some 2 ms per MiB on a loaded VM) and the hole punch of
// the old ones (0.3-0.7 ms per MiB). Alloc never gets a pooled frame: when
// it finds too few free frames, pooled ones are punched out first.
//
// A pinned migration's frames are locked (mlock of their NIC view). When
// the process may lock memory without limit (CAP_IPC_LOCK, or
// RLIMIT_MEMLOCK unlimited), they join the pool still locked, their lock
// reference (pageRefs) handed to the pool, and the next pinned migration
// takes them over as they are: neither the munlock at Release nor the
// mlock at PrepareMigrate (some 100-200 µs per MiB each) is made. Without
// that privilege they are unlocked first: locked memory that no PinAccount
// is charged for would use up the RLIMIT_MEMLOCK the accounts check
// against. A locked frame leaving the pool for anything else (a plain
// migration, the hole punch, Close) is unlocked.
type frameAllocator struct {
	sync.Mutex
	capacity uint32 // frames in the memfd
	next     uint32 // frames [next, capacity) were never handed out
	queue    []Frame
	head     int // queue[head:] are released frames, oldest first
	inUse    int // frames handed out and not released (pooled frames are not in use)
	// pool[poolHead:] is the migration pool, oldest first; at most
	// poolMax frames.
	pool     []pooledFrame
	poolHead int
	poolMax  int
	// pinGen counts the changes of pins (pin and unpin calls): a
	// migration that saw no change since its PrepareMigrate need not
	// check its frames' pins again in the critical section.
	pinGen uint64
	// pins counts the FramePins holding each pinned frame, in chunks of
	// pinChunk frames made on first use, as the page map (a pinned
	// migration pins and unpins every frame it moves: with a map that
	// cost 23-29 µs per MiB here, with the array 3 µs); npinned counts
	// the frames with a pin.
	pins    []*[pinChunk]int32
	npinned int
	// orphans are pinned frames that their page lost (Free): released at
	// their last unpin.
	orphans map[Frame]struct{}
}

// pooledFrame is a frame of the migration pool.
type pooledFrame struct {
	f Frame
	// populated: the frame is known to hold a page (it was populated, or
	// pinned); else it may be a hole, which a migration populates.
	populated bool
	// locked: the frame's NIC view is locked, and the pool holds its lock
	// reference (pageRefs).
	locked bool
}

func (a *frameAllocator) init(capacity uint32, poolMax int) {
	a.capacity = capacity
	a.poolMax = poolMax
	a.pins = make([]*[pinChunk]int32, (capacity+pinChunk-1)/pinChunk)
	a.orphans = make(map[Frame]struct{})
}

func (a *frameAllocator) queued() int { return len(a.queue) - a.head }

func (a *frameAllocator) pooled() int { return len(a.pool) - a.poolHead }

// alloc fills out with frames that read zeros, for application memory:
// released frames beyond the quarantine first, then never-used frames
// (contiguous), then the quarantine itself; if those are too few, pooled
// frames are punched out and join them.
func (a *frameAllocator) alloc(s *AddressSpace, out []Frame) error {
	a.Lock()
	defer a.Unlock()
	return a.allocLocked(s, out)
}

func (a *frameAllocator) allocLocked(s *AddressSpace, out []Frame) error {
	n := len(out)
	if short := n - a.queued() - int(a.capacity-a.next); short > 0 && a.pooled() > 0 {
		a.evictLocked(s, a.popPool(min(short, a.pooled())))
	}
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

// allocMigration fills out with the new frames of a migration: pooled
// frames beyond the pool's quarantine first (oldest first, so that runs of
// contiguous frames stay together), then as alloc. It returns the frames
// that may hold no page (fresh ones, pooled ones not known populated),
// which the caller populates, and whether each frame of out comes locked
// (a pooled frame whose lock reference the caller now holds). The pooled
// frames keep the bytes of their last page: the migration must overwrite
// every one (CopyPage of every page) before the switch.
func (a *frameAllocator) allocMigration(s *AddressSpace, out []Frame) (unpopulated []Frame, locked []bool, err error) {
	a.Lock()
	defer a.Unlock()
	k := min(len(out), max(a.pooled()-poolQuarantine, 0))
	taken := slices.Clone(a.pool[a.poolHead : a.poolHead+k])
	clear(a.pool[a.poolHead : a.poolHead+k])
	a.poolHead += k
	if err := a.allocLocked(s, out[k:]); err != nil {
		// Back at the head of the pool, as they were.
		a.pool = append(taken, a.pool[a.poolHead:]...)
		a.poolHead = 0
		return nil, nil, err
	}
	a.compactPool()
	locked = make([]bool, len(out))
	for i, p := range taken {
		out[i] = p.f
		locked[i] = p.locked
		if !p.populated {
			unpopulated = append(unpopulated, p.f)
		}
	}
	a.inUse += k
	return append(unpopulated, out[k:]...), locked, nil
}

// popPool removes the n oldest pooled frames.
func (a *frameAllocator) popPool(n int) []pooledFrame {
	ps := slices.Clone(a.pool[a.poolHead : a.poolHead+n])
	clear(a.pool[a.poolHead : a.poolHead+n])
	a.poolHead += n
	a.compactPool()
	return ps
}

// evictLocked unlocks the locked ones of frames taken out of the pool and
// punches them all out.
func (a *frameAllocator) evictLocked(s *AddressSpace, ps []pooledFrame) {
	fs := make([]Frame, len(ps))
	var locked []Frame
	for i, p := range ps {
		fs[i] = p.f
		if p.locked {
			locked = append(locked, p.f)
		}
	}
	s.unlockFrames(locked)
	a.punchLocked(s, fs)
}

// drainPool empties the pool: its locked frames are unlocked, and all are
// punched out.
func (a *frameAllocator) drainPool(s *AddressSpace) {
	a.Lock()
	defer a.Unlock()
	a.evictLocked(s, a.popPool(a.pooled()))
}

func (a *frameAllocator) compactPool() {
	if a.poolHead == len(a.pool) {
		a.pool, a.poolHead = a.pool[:0], 0
	} else if a.poolHead >= 1024 && a.poolHead*2 >= len(a.pool) {
		a.pool = a.pool[:copy(a.pool, a.pool[a.poolHead:])]
		a.poolHead = 0
	}
}

// recycle gives back frames of a migration: they join the migration pool
// with their memory and bytes (populated[i] says whether frames[i] is known
// to hold a page; nil: all are), and the oldest pooled frames beyond the
// pool's bound are punched out and released. locked says that every frame
// is locked and the caller hands its lock references over: the pool keeps
// them locked if the process may lock without limit, else they are
// unlocked. Pinned frames become orphans (unlocked).
func (a *frameAllocator) recycle(s *AddressSpace, frames []Frame, populated []bool, locked bool) {
	if locked && !lockUnlimited() {
		s.unlockFrames(frames)
		locked = false
	}
	a.Lock()
	defer a.Unlock()
	if a.poolMax <= 0 || s.closed.Load() {
		if locked {
			s.unlockFrames(frames)
		}
		a.releaseLocked(s, a.unpinnedLocked(frames))
		return
	}
	var orphans []Frame
	for i, f := range frames {
		if a.pinCount(f) > 0 {
			a.orphans[f] = struct{}{}
			orphans = append(orphans, f)
			continue
		}
		a.pool = append(a.pool, pooledFrame{f: f, populated: populated == nil || populated[i], locked: locked})
		a.inUse--
	}
	if locked {
		s.unlockFrames(orphans)
	}
	if over := a.pooled() - a.poolMax; over > 0 {
		a.evictLocked(s, a.popPool(over))
	}
}

// lockUnlimited reports whether the process may lock memory without limit
// (CAP_IPC_LOCK, or no finite RLIMIT_MEMLOCK).
func lockUnlimited() bool {
	_, limited := memlockLimit()
	return !limited
}

// unpinnedLocked returns the frames no pin holds and makes the others
// orphans, released at their last unpin.
func (a *frameAllocator) unpinnedLocked(frames []Frame) []Frame {
	free := frames[:0:0]
	for _, f := range frames {
		if a.pinCount(f) > 0 {
			a.orphans[f] = struct{}{}
			continue
		}
		free = append(free, f)
	}
	return free
}

// release gives frames back: their memory is returned to the system with a
// hole punch (so that a frame handed out again reads zeros) before they
// join the queue. Pinned frames become orphans instead.
func (a *frameAllocator) release(s *AddressSpace, frames []Frame) {
	a.Lock()
	defer a.Unlock()
	a.releaseLocked(s, a.unpinnedLocked(frames))
}

func (a *frameAllocator) releaseLocked(s *AddressSpace, frames []Frame) {
	a.punchLocked(s, frames)
	a.inUse -= len(frames)
}

// punchLocked returns the memory of frames (not in use) to the system and
// queues them for reuse.
func (a *frameAllocator) punchLocked(s *AddressSpace, frames []Frame) {
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
}

// pinChunk is the number of frames per chunk of pin counts.
const pinChunk = 512

// pinCount returns frame f's pin count.
func (a *frameAllocator) pinCount(f Frame) int32 {
	c := a.pins[f/pinChunk]
	if c == nil {
		return 0
	}
	return c[f%pinChunk]
}

// pinRef returns frame f's pin count, making its chunk.
func (a *frameAllocator) pinRef(f Frame) *int32 {
	c := a.pins[f/pinChunk]
	if c == nil {
		c = new([pinChunk]int32)
		a.pins[f/pinChunk] = c
	}
	return &c[f%pinChunk]
}

// pin adds a pin reference to each frame, and returns the pin generation
// it made.
func (a *frameAllocator) pin(frames []Frame) uint64 {
	a.Lock()
	defer a.Unlock()
	a.pinGen++
	for _, f := range frames {
		c := a.pinRef(f)
		if *c == 0 {
			a.npinned++
		}
		*c++
	}
	return a.pinGen
}

// unpin drops a pin reference from each frame and releases the orphans
// that no pin holds any more.
func (a *frameAllocator) unpin(s *AddressSpace, frames []Frame) {
	a.Lock()
	defer a.Unlock()
	a.pinGen++
	var free []Frame
	for _, f := range frames {
		c := a.pinRef(f)
		switch {
		case *c <= 0:
			panic("hostmem: unpin of a frame that is not pinned")
		case *c == 1:
			*c = 0
			a.npinned--
			if _, ok := a.orphans[f]; ok {
				delete(a.orphans, f)
				free = append(free, f)
			}
		default:
			*c--
		}
	}
	a.releaseLocked(s, free)
}

// pinned reports whether any of frames is pinned.
func (a *frameAllocator) pinned(frames []Frame) bool {
	a.Lock()
	defer a.Unlock()
	for _, f := range frames {
		if a.pinCount(f) > 0 {
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
		if a.pinCount(f) != 1 {
			return false
		}
	}
	return true
}

func (a *frameAllocator) pinnedFrames() int {
	a.Lock()
	defer a.Unlock()
	return a.npinned
}

func (a *frameAllocator) counts() (inUse, free, pooled, pooledLocked, unused int) {
	a.Lock()
	defer a.Unlock()
	for _, p := range a.pool[a.poolHead:] {
		if p.locked {
			pooledLocked++
		}
	}
	return a.inUse, a.queued(), a.pooled(), pooledLocked, int(a.capacity - a.next)
}

// pinGeneration returns the count of pin changes.
func (a *frameAllocator) pinGeneration() uint64 {
	a.Lock()
	defer a.Unlock()
	return a.pinGen
}

// unlockFrames drops a lock reference of each frame's NIC view (munlock of
// the pages it was the last to hold). munlock can only fail for an address
// that is not mapped, which the NIC view always is.
func (s *AddressSpace) unlockFrames(frames []Frame) {
	forFrameRuns(frames, func(f Frame, n int) {
		_ = unlockPages(uintptr(s.FramePointer(f)), uintptr(n))
	})
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
