package hostmem

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrPinLimit is wrapped by every error that refuses a pin because a limit
// would be exceeded (see PinLimitError).
var ErrPinLimit = errors.New("hostmem: pin limit exceeded")

// PinLimitError reports a pin refused by a limit. It matches ErrPinLimit
// with errors.Is.
type PinLimitError struct {
	Request int64 // bytes asked for, page-rounded
	Pinned  int64 // bytes already pinned against the same limit
	Limit   int64 // the limit in bytes
	Rlimit  bool  // the limit is RLIMIT_MEMLOCK, not a configured one
}

func (e *PinLimitError) Error() string {
	if e.Rlimit {
		return fmt.Sprintf("hostmem: pin %d bytes: would exceed RLIMIT_MEMLOCK (%d bytes, %d already pinned); raise it with ulimit -l or run with CAP_IPC_LOCK",
			e.Request, e.Limit, e.Pinned)
	}
	return fmt.Sprintf("hostmem: pin %d bytes: would exceed the configured pin limit (%d bytes, %d already pinned)",
		e.Request, e.Limit, e.Pinned)
}

// Is makes errors.Is(err, ErrPinLimit) true.
func (e *PinLimitError) Is(target error) bool { return target == ErrPinLimit }

// processPinned counts the bytes pinned by every PinAccount of the process,
// registrations counted separately even where they overlap: the analogue of
// the kernel's per-mm pinned_vm, which RLIMIT_MEMLOCK bounds.
var processPinned atomic.Int64

// PinAccount is the pin budget of one device. Every Pin is charged in whole
// pages; overlapping registrations are charged twice, as the kernel charges
// pinned_vm. Two limits apply, as in ib_umem_get:
//
//   - a configured limit (> 0) bounds this account and is always enforced;
//   - with no configured limit, the bytes pinned by the whole process are
//     bounded by RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK
//     ("if new_pinned > lock_limit && !capable(CAP_IPC_LOCK)").
//
// A PinAccount is safe for concurrent use.
type PinAccount struct {
	limit atomic.Int64 // configured limit in bytes; 0: the RLIMIT_MEMLOCK rule

	mu struct {
		sync.Mutex
		pinned int64 // bytes currently charged
		peak   int64 // highest value of pinned
	}
}

// NewPinAccount returns an account with a configured limit in bytes; 0 (or
// a negative value) selects the RLIMIT_MEMLOCK rule.
func NewPinAccount(limit int64) *PinAccount {
	if limit < 0 {
		limit = 0
	}
	a := &PinAccount{}
	a.limit.Store(limit)
	return a
}

// SetLimit changes the configured limit at run time (0: the RLIMIT_MEMLOCK
// rule). Lowering it below what is pinned unpins nothing: later charges
// fail until enough is released (the memory-pressure upcall asks the
// application for it).
func (a *PinAccount) SetLimit(limit int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limit.Store(max(limit, 0))
}

// Pinned returns the bytes currently charged to the account.
func (a *PinAccount) Pinned() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.pinned
}

// Peak returns the highest number of bytes the account ever had pinned.
func (a *PinAccount) Peak() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.peak
}

// Limit returns the limit in force for this account now: the configured one,
// else RLIMIT_MEMLOCK when the process lacks CAP_IPC_LOCK, else -1 (none).
func (a *PinAccount) Limit() int64 {
	if l := a.limit.Load(); l > 0 {
		return l
	}
	if lim, ok := memlockLimit(); ok {
		return lim
	}
	return -1
}

// charge reserves n bytes against the account's limits.
func (a *PinAccount) charge(n int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	limit := a.limit.Load()
	if limit > 0 && a.mu.pinned+n > limit {
		return &PinLimitError{Request: n, Pinned: a.mu.pinned, Limit: limit}
	}
	total := processPinned.Add(n)
	if limit == 0 {
		if lim, ok := memlockLimit(); ok && total > lim {
			processPinned.Add(-n)
			return &PinLimitError{Request: n, Pinned: total - n, Limit: lim, Rlimit: true}
		}
	}
	a.mu.pinned += n
	a.mu.peak = max(a.mu.peak, a.mu.pinned)
	return nil
}

func (a *PinAccount) uncharge(n int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mu.pinned -= n
	processPinned.Add(-n)
}

// memlockLimit returns RLIMIT_MEMLOCK's soft limit and true if it applies to
// this process: it is finite and the process lacks CAP_IPC_LOCK. Both are
// read on every call, as the kernel reads them on every registration.
func memlockLimit() (int64, bool) {
	if HasCapIPCLock() {
		return 0, false
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return 0, false
	}
	return int64(min(rl.Cur, 1<<62)), true
}

// capIPCLock is CAP_IPC_LOCK's bit number (linux/capability.h).
const capIPCLock = 14

// HasCapIPCLock reports whether the process's effective capability set holds
// CAP_IPC_LOCK, which lifts RLIMIT_MEMLOCK for mlock and for RDMA pinning.
func HasCapIPCLock() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err == nil {
		return data[capIPCLock/32].Effective&(1<<(capIPCLock%32)) != 0
	}
	// Fall back to CapEff in /proc/self/status.
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && eff&(1<<capIPCLock) != 0
		}
	}
	return false
}

// Pin is one pinned range, returned by PinAccount.Pin.
type Pin struct {
	acct  *PinAccount
	mem   []byte  // the pinned bytes, referenced so that they stay alive
	first uintptr // address of the first page
	pages uintptr
	done  atomic.Bool
}

// Bytes returns the bytes charged for the pin (whole pages).
func (p *Pin) Bytes() int64 { return int64(p.pages) << PageShift }

// Pin makes the pages under b resident and locked, as ib_umem_get pins a
// user range: it charges the account, prefaults the pages (MADV_POPULATE_WRITE
// when write is set, else MADV_POPULATE_READ; when the kernel lacks those
// (before 5.14) it touches one word per page) and mlocks every page that
// no other Pin holds. mlock does not nest, so pages are reference counted
// process-wide: the last Unpin of a page unlocks it.
//
// The memory must stay mapped until Unpin; the Pin keeps b referenced so
// that the garbage collector keeps Go memory alive (Go's heap does not move
// objects). b must not be on a goroutine stack: pass memory that escapes
// (any []byte stored by the caller does).
func (a *PinAccount) Pin(b []byte, write bool) (*Pin, error) {
	if len(b) == 0 {
		return nil, errors.New("hostmem: pin of an empty range")
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first := addr &^ pageMask
	pages := (addr + uintptr(len(b)) - first + pageMask) >> PageShift
	p := &Pin{acct: a, mem: b, first: first, pages: pages}
	if err := a.charge(p.Bytes()); err != nil {
		return nil, err
	}
	if err := populate(b, first, pages, write); err != nil {
		a.uncharge(p.Bytes())
		return nil, err
	}
	if err := lockPages(first, pages); err != nil {
		a.uncharge(p.Bytes())
		return nil, err
	}
	return p, nil
}

// Unpin unlocks the pages no other Pin holds and uncharges the account.
// A second Unpin of the same Pin is an error.
func (p *Pin) Unpin() error {
	if !p.done.CompareAndSwap(false, true) {
		return errors.New("hostmem: unpin of a released pin")
	}
	err := unlockPages(p.first, p.pages)
	p.acct.uncharge(p.Bytes())
	p.mem = nil
	return err
}

// pageRefs reference-counts locked pages of the process. mlock state is
// per process, not per device, so this table is package-level: two devices
// (or two MRs of one device) that pin the same page must not unlock each
// other's. It is used at registration time only.
var pageRefs struct {
	sync.Mutex
	count map[uintptr]int32 // guarded by Mutex; page address -> pins
}

func lockPages(first, pages uintptr) error {
	pageRefs.Lock()
	defer pageRefs.Unlock()
	if pageRefs.count == nil {
		pageRefs.count = make(map[uintptr]int32)
	}
	// Lock the runs of pages that nobody holds yet. The mutex is held across
	// the system calls so that an Unpin cannot unlock a page between our
	// count and our mlock.
	var locked [][2]uintptr
	err := forRuns(first, pages, func(pg uintptr) bool { return pageRefs.count[pg] == 0 },
		func(start, n uintptr) error {
			if err := mlock(start, n); err != nil {
				return err
			}
			locked = append(locked, [2]uintptr{start, n})
			return nil
		})
	if err != nil {
		for _, r := range locked {
			_ = munlock(r[0], r[1])
		}
		return err
	}
	for i := uintptr(0); i < pages; i++ {
		pageRefs.count[first+i<<PageShift]++
	}
	return nil
}

func unlockPages(first, pages uintptr) error {
	pageRefs.Lock()
	defer pageRefs.Unlock()
	for i := uintptr(0); i < pages; i++ {
		pg := first + i<<PageShift
		if pageRefs.count[pg] <= 0 {
			panic("hostmem: unpin of a page that is not pinned")
		}
		pageRefs.count[pg]--
	}
	err := forRuns(first, pages, func(pg uintptr) bool { return pageRefs.count[pg] == 0 },
		func(start, n uintptr) error { return munlock(start, n) })
	for i := uintptr(0); i < pages; i++ {
		if pg := first + i<<PageShift; pageRefs.count[pg] == 0 {
			delete(pageRefs.count, pg)
		}
	}
	return err
}

// PinnedPages returns how many distinct pages the process holds locked
// through this package.
func PinnedPages() int {
	pageRefs.Lock()
	defer pageRefs.Unlock()
	return len(pageRefs.count)
}

// forRuns calls fn for each maximal run of consecutive pages, among pages
// pages from first, for which sel is true, stopping at the first error.
func forRuns(first, pages uintptr, sel func(uintptr) bool, fn func(start, n uintptr) error) error {
	for i := uintptr(0); i < pages; {
		if !sel(first + i<<PageShift) {
			i++
			continue
		}
		j := i + 1
		for j < pages && sel(first+j<<PageShift) {
			j++
		}
		if err := fn(first+i<<PageShift, (j-i)<<PageShift); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// The system calls below take page addresses as uintptr: the ranges are
// page-rounded and may begin before the Go object that b is (its page's
// start), so no unsafe.Pointer may be formed for them. The memory is kept
// alive by the caller's reference to b.

func mlock(addr, n uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MLOCK, addr, n, 0); e != 0 {
		err := fmt.Errorf("hostmem: mlock %#x+%d: %w", addr, n, e)
		if e == unix.ENOMEM || e == unix.EPERM || e == unix.EAGAIN {
			err = fmt.Errorf("%w (the kernel refused to lock the pages: check ulimit -l and CAP_IPC_LOCK)", err)
		}
		return err
	}
	return nil
}

func munlock(addr, n uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MUNLOCK, addr, n, 0); e != 0 {
		return fmt.Errorf("hostmem: munlock %#x+%d: %w", addr, n, e)
	}
	return nil
}

// noPopulate is set once the kernel has answered EINVAL to MADV_POPULATE_*
// (kernels before 5.14).
var noPopulate atomic.Bool

// populate faults in every page under b, for writing if write is set,
// without changing a byte.
func populate(b []byte, first, pages uintptr, write bool) error {
	if ok, err := madvisePopulate(first, pages, write); ok || err != nil {
		return err
	}
	touch(b, write)
	return nil
}

// madvisePopulate populates pages pages from first with MADV_POPULATE_WRITE
// (or _READ). ok is false, with no error, on a kernel without them (before
// 5.14, EINVAL; noPopulate is then set): the caller touches the pages
// itself, through a mapping that cannot go away under it.
func madvisePopulate(first, pages uintptr, write bool) (ok bool, err error) {
	if noPopulate.Load() {
		return false, nil
	}
	advice := uintptr(unix.MADV_POPULATE_READ)
	if write {
		advice = unix.MADV_POPULATE_WRITE
	}
	var e unix.Errno
	for try := 0; ; try++ {
		_, _, e = unix.Syscall(unix.SYS_MADVISE, first, pages<<PageShift, advice)
		// A signal interrupts the population (EINTR; the Go runtime
		// preempts goroutines with SIGURG): what is populated stays,
		// and the call is made again for the rest.
		if (e == unix.EINTR || e == unix.EAGAIN) && try < 1000 {
			continue
		}
		break
	}
	switch e {
	case 0:
		return true, nil
	case unix.EINVAL:
		noPopulate.Store(true)
		return false, nil
	}
	return false, fmt.Errorf("hostmem: prefault %#x+%d: %w", first, pages<<PageShift, e)
}

// touch faults in the pages under b by hand: an atomic add of zero to one
// aligned word per page (a write fault that cannot lose a concurrent store),
// or a read of one byte per page. A page whose part of b holds no aligned
// word is read only; mlock then faults it in for writing (mlock populates
// writable private mappings with write faults).
func touch(b []byte, write bool) {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	var sink byte
	for off := uintptr(0); off < uintptr(len(b)); {
		next := (base+off)&^pageMask + PageSize - base // offset of the next page
		w := off + (4-(base+off)&3)&3                  // first 4-aligned offset from off
		if write && w+4 <= min(next, uintptr(len(b))) {
			atomic.AddUint32((*uint32)(unsafe.Pointer(&b[w])), 0)
		} else {
			sink ^= b[off]
		}
		off = next
	}
	runtime.KeepAlive(sink)
}
