// Package softrdma is a software RDMA NIC: the verbs API (after
// libibverbs) over a RoCEv2 engine that runs on ordinary UDP sockets.
//
// A program opens a Device on a local IP address, allocates a protection
// domain, registers memory, creates completion queues and queue pairs,
// connects a QP to a peer by moving it through INIT, RTR and RTS with the
// peer's address, QPN and PSN (exchanged out of band, as perftest does over
// TCP), and posts work requests. Names and semantics follow libibverbs
// (ibv_open_device, ibv_alloc_pd, ibv_reg_mr, ibv_create_cq, ibv_create_qp,
// ibv_modify_qp, ibv_post_send, ibv_post_recv, ibv_poll_cq) and the IBTA
// specification, Vol. 1, chapters 9-11.
package softrdma

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// Config configures Open.
type Config struct {
	// Addr is the local IP address and UDP port the device binds; the IP
	// is the device's GID (as an IPv4-mapped or plain IPv6 GID). The
	// default is 127.0.0.1:4791; port 0 picks a free port.
	Addr netip.AddrPort
	// PinLimit caps the bytes of pinned memory (0: RLIMIT_MEMLOCK, enforced
	// as the kernel does, only without CAP_IPC_LOCK).
	PinLimit int64
	// Impair injects loss, reordering, duplication, corruption and delay
	// (nil: none). See conn.ParseImpairment for the CLI syntax.
	Impair *conn.Impairment
	// Tap receives every datagram sent and received (e.g. a pcap writer).
	Tap conn.Tap
	// DisableGSO and DisableGRO turn off UDP segmentation offloads.
	DisableGSO, DisableGRO bool
	// Conn, if set, is used instead of a UDP socket (tests: conn.NewPipe).
	Conn conn.Conn
	// Logf receives rate-limited warnings; nil is silent.
	Logf func(format string, args ...any)

	// Profile selects the emulated device's memory-management features
	// ("": ProfileODP).
	Profile Profile
	// AddressSpace is the host address space ODP MRs are registered on
	// (nil: the device creates one at the first Device.AddressSpace or
	// ODP registration).
	AddressSpace *hostmem.AddressSpace
	// ODPBudget bounds the bytes the device's ODP MRs hold present at
	// once; over it the least recently used pages are evicted (0:
	// unlimited; negative: Open fails). See pagetable.Budget.
	ODPBudget int64
	// FaultPolicy is how the responder meets a page fault on an ODP MR
	// (FaultSync, the default, or FaultRNR).
	FaultPolicy FaultPolicy
	// SourcePort is the UDP source port of the packets the device sends.
	// SourcePortSpread (0, the default) spreads QPs over 0xC000-0xFFFF as
	// Linux rxe does: each QP sends from the port rxe would give it, a
	// hash of its QPN and its peer's (QP.SourcePort; docs/wire.md).
	// SourcePortOwn (-1), or Addr's port, sends everything from the
	// device's own socket; any other port number sends everything from
	// that port (Open fails if it cannot be bound). The device receives on
	// Addr's port in every case.
	SourcePort int
	// SlowRestart makes a retransmit timeout resend one packet and grow
	// the window back as ACKs return (RFC 5681 3.1's loss window; NVIDIA
	// ConnectX's "slow restart"), instead of resending the whole go-back-N
	// window as rxe does (and an RDMA READ is asked for again in pieces
	// no longer than that window, not all its missing responses at once):
	// for a receiver that falls behind (a loaded host), which full-window
	// resends on every expiry drown in copies. It costs
	// throughput where the QP timeout is close to the round trip (a false
	// timeout restarts from one packet). Off by default; see
	// transport.Config.SlowRestart.
	SlowRestart bool
}

// Values of Config.SourcePort besides a port number.
const (
	SourcePortSpread = transport.SourcePortSpread
	SourcePortOwn    = transport.SourcePortOwn
)

// Device is an open softrdma NIC (struct ibv_context).
type Device struct {
	t     *transport.Device
	place *placement.Engine
	conn  conn.Conn
	pdSeq atomic.Uint32
	mu    sync.Mutex

	profile Profile
	odp     odpState
	remapMu sync.Mutex // one remap at a time

	pressure struct {
		sync.Mutex
		h func(PressureRequest) PressureAnswer
	}
}

// Open creates a device bound to cfg.Addr (ibv_open_device). Errors: the
// address cannot be bound; cfg is invalid (an unknown profile or fault
// policy, a negative ODPBudget), which wraps EINVAL (placement.ErrInvalid).
func Open(cfg Config) (*Device, error) {
	if !cfg.Profile.valid() {
		return nil, fmt.Errorf("softrdma: open: unknown profile %q (odp, t3, coarse): %w", cfg.Profile, placement.ErrInvalid)
	}
	if cfg.FaultPolicy > FaultRNR {
		return nil, fmt.Errorf("softrdma: open: unknown fault policy %d: %w", cfg.FaultPolicy, placement.ErrInvalid)
	}
	if cfg.ODPBudget < 0 {
		return nil, fmt.Errorf("softrdma: open: ODPBudget %d: must not be negative (0: unlimited): %w", cfg.ODPBudget, placement.ErrInvalid)
	}
	c := cfg.Conn
	if c != nil {
		if cfg.Impair != nil {
			if err := c.SetImpairment(cfg.Impair); err != nil {
				return nil, operr.Wrap("softrdma", "open", err)
			}
		}
		if cfg.Tap != nil {
			c.SetTap(cfg.Tap)
		}
	} else {
		addr := cfg.Addr
		if !addr.IsValid() {
			addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), wire.RoCEv2Port)
		}
		var err error
		c, err = conn.Listen(conn.Config{
			Addr: addr, Impair: cfg.Impair, Tap: cfg.Tap,
			DisableGSO: cfg.DisableGSO, DisableGRO: cfg.DisableGRO, Logf: cfg.Logf,
		})
		if err != nil {
			return nil, fmt.Errorf("softrdma: open %v: %w", addr, err)
		}
	}
	place := placement.New(placement.Config{PinLimit: cfg.PinLimit, AddressSpace: cfg.AddressSpace,
		ODPBudget: cfg.ODPBudget, NoODP: !cfg.Profile.odp()})
	t, err := transport.NewDevice(transport.Config{Conn: c, Placement: place, Logf: cfg.Logf, FaultPolicy: cfg.FaultPolicy,
		ActiveMTU: activeMTU(c.LocalAddr().Addr()), SourcePort: cfg.SourcePort,
		SlowRestart: cfg.SlowRestart})
	if err != nil {
		c.Close()
		return nil, operr.Wrap("softrdma", "open", err)
	}
	profile := cfg.Profile
	if profile == "" {
		profile = ProfileODP
	}
	d := &Device{t: t, place: place, conn: c, profile: profile}
	d.odp.as = cfg.AddressSpace
	return d, nil
}

func (d *Device) closed() bool { return d.t.Closed() }

// activeMTU derives the port's active MTU from the MTU of the interface
// that holds addr, as rxe does (transport.ActiveMTUFor: link MTU minus 80
// bytes of headers, rounded down to 256-4096). An address on no interface
// (a wildcard, an in-memory conn) gets MTU4096.
func activeMTU(addr netip.Addr) MTU {
	ifs, err := net.Interfaces()
	if err != nil || !addr.IsValid() || addr.IsUnspecified() {
		return MTU4096
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == addr.Unmap() {
					return transport.ActiveMTUFor(ifc.MTU)
				}
			}
		}
	}
	return MTU4096
}

// Close destroys every QP (flushing their WRs) and releases the socket
// (ibv_close_device). Registered MRs stay valid memory but are no longer
// reachable by the network.
func (d *Device) Close() error {
	err := d.t.Close()
	d.odp.mu.Lock()
	defer d.odp.mu.Unlock()
	if d.odp.own && d.odp.as != nil {
		// MRs still registered on it keep their subscriptions; the
		// address space refuses to close then (hostmem.ErrBusy), and its
		// memory stays mapped for them.
		if cerr := d.odp.as.Close(); cerr == nil {
			d.odp.as = nil
		}
	}
	return err
}

// GID returns the device's address as a 16-byte GID (IPv4 addresses are
// IPv4-mapped, ::ffff:a.b.c.d, as RoCEv2 GID index 1 is in rxe).
func (d *Device) GID() [16]byte { return d.conn.LocalAddr().Addr().As16() }

// LocalAddr returns the bound UDP address.
func (d *Device) LocalAddr() netip.AddrPort { return d.conn.LocalAddr() }

// Counters returns the device's hardware counters (rxe hw_counters names).
func (d *Device) Counters() *transport.Counters { return d.t.Counters() }

// SetImpairment replaces the loss, reordering, duplication, corruption and
// delay injected on this device's traffic, at run time (nil: none). An
// invalid impairment is rejected and the old one kept.
func (d *Device) SetImpairment(imp *conn.Impairment) error { return d.conn.SetImpairment(imp) }

// HostAlloc allocates size bytes of memfd-backed memory that the
// application and the NIC map together (see package hostmem); register
// its Bytes() with RegMR. Free it with its Free method after DeregMR.
func (d *Device) HostAlloc(size int) (*hostmem.Buffer, error) { return d.place.HostAlloc(size) }

// Snapshot returns every counter by name: rxe's hw_counters, the drops
// by reason (drop_socket_overflow: those the kernel dropped at the
// device's socket, its receive buffer full), the impairment counts and
// socket_rx_queued_bytes, what waits in the socket now (see
// transport.Device.Snapshot).
func (d *Device) Snapshot() []transport.Counter { return d.t.Snapshot() }

// ConnStats returns the socket-level counters (datagrams, syscalls, GSO,
// bad ICRC, impairment).
func (d *Device) ConnStats() *conn.Stats { return d.conn.Stats() }

// DeviceAttr describes a device (struct ibv_device_attr and the port's
// ibv_port_attr, the fields that matter here).
type DeviceAttr struct {
	MaxQP           int    // QPs
	MaxQPWR         int    // WRs per queue
	MaxSGE          int    // SGEs per WR
	MaxCQE          int    // completions per CQ
	MaxMRSize       uint64 // bytes
	MaxQPRdAtom     int    // outstanding READ/atomic as target (max_qp_rd_atom)
	MaxQPInitRdAtom int    // as initiator (max_qp_init_rd_atom)
	MaxInlineData   int    // bytes
	PageSizeCap     uint64 // bytes (4096)
	AtomicCap       string // "ATOMIC_HCA": atomic with respect to this device's own atomics
	ActiveMTU       MTU    // largest path MTU (4096)
	GID             [16]byte
	ODPCaps         ODPCaps // on-demand paging (ibv_device_attr_ex.odp_caps)
	Profile         Profile // the device profile
	// FinestScope is the narrowest scope the device can pause placement
	// at (a scope, not a boolean): finer requests are widened to it.
	FinestScope Scope
}

// MaxCQE is the largest CQ depth.
const MaxCQE = 1 << 20

// Attr returns the device's attributes (ibv_query_device + ibv_query_port).
func (d *Device) Attr() DeviceAttr {
	return DeviceAttr{
		MaxQP: transport.MaxQPN - transport.FirstQPN, MaxQPWR: transport.MaxQPWR,
		MaxSGE: transport.MaxSGE, MaxCQE: MaxCQE, MaxMRSize: 1 << 40,
		MaxQPRdAtom: transport.MaxRdAtomic, MaxQPInitRdAtom: transport.MaxRdAtomic,
		MaxInlineData: transport.MaxInline, PageSizeCap: 4096, AtomicCap: "ATOMIC_HCA",
		ActiveMTU: d.t.ActiveMTU(), GID: d.GID(), ODPCaps: d.profile.odpCaps(), Profile: d.profile,
		FinestScope: d.profile.FinestScope(),
	}
}

// PD is a protection domain (struct ibv_pd).
type PD struct {
	dev *Device
	id  uint32
	// mu is held for reading while something is created in the PD (MR,
	// MW, QP, AH) and for writing by DeallocPD, which sets dead.
	mu   sync.RWMutex
	dead bool
}

// usePD checks pd for a call that creates something in it and holds it
// against DeallocPD until the returned release. Errors: ErrBadPD (nil,
// another device's, or deallocated).
func (d *Device) usePD(pd *PD) (release func(), err error) {
	if pd == nil || pd.dev != d {
		return nil, ErrBadPD
	}
	pd.mu.RLock()
	if pd.dead {
		pd.mu.RUnlock()
		return nil, ErrBadPD
	}
	return pd.mu.RUnlock, nil
}

// DeallocPD deallocates pd (ibv_dealloc_pd). Errors: ErrBadPD (nil,
// another device's PD, or deallocated already); EBUSY (errors.Is with
// unix.EBUSY, as ibv_dealloc_pd(3)) while an MR, a memory window, a QP or
// an address handle of pd exists. Afterwards every call given pd returns ErrBadPD.
func (d *Device) DeallocPD(pd *PD) error {
	if pd == nil || pd.dev != d {
		return ErrBadPD
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.dead {
		return ErrBadPD
	}
	if what := d.place.PDInUse(pd.id); what != "" {
		return fmt.Errorf("softrdma: dealloc PD: %s of the PD exists: %w", what, transport.ErrBusy)
	}
	if what := d.t.PDInUse(pd.id); what != "" {
		return fmt.Errorf("softrdma: dealloc PD: %s of the PD exists: %w", what, transport.ErrBusy)
	}
	pd.dead = true
	return nil
}

// AllocPD allocates a protection domain (ibv_alloc_pd). Errors: ErrClosed
// after the device's Close.
func (d *Device) AllocPD() (*PD, error) {
	if d.closed() {
		return nil, fmt.Errorf("softrdma: alloc PD: %w", transport.ErrClosed)
	}
	return &PD{dev: d, id: d.pdSeq.Add(1)}, nil
}

// MR is a registered memory region (struct ibv_mr): LKey(), RKey(),
// Addr() (the IOVA of its first byte, what a peer puts in a RETH) and
// Len() in bytes.
type MR = placement.MR

// ErrBadPD is returned for a nil PD, one allocated on another device, or
// one deallocated (DeallocPD).
var ErrBadPD = errors.New("softrdma: nil PD, a PD of another device, or a deallocated PD")

// ErrBadAccess is returned when REMOTE_WRITE or REMOTE_ATOMIC is asked
// without LOCAL_WRITE (IBTA 10.6.3.1, ibv_reg_mr(3): EINVAL).
var ErrBadAccess = errors.New("softrdma: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE")

// RegMR registers buf in pd with the given access (ibv_reg_mr). The pages
// are prefaulted and locked (mlock); the MR's IOVA is the address of
// buf[0]. With AccessOnDemand nothing is pinned: buf must be memory of the
// device's AddressSpace, and its pages are faulted in when first used
// (ODP). Errors: empty buffer, ErrBadAccess, a pin limit (the error names
// RLIMIT_MEMLOCK or the configured limit); for ODP, ErrNoODP on a profile
// without it and an invalid-argument error for memory outside the address
// space.
func (d *Device) RegMR(pd *PD, buf []byte, access Access) (*MR, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := d.checkReg(pd, access); err != nil {
		return nil, err
	}
	if access&AccessOnDemand != 0 {
		if _, err := d.AddressSpace(); err != nil {
			return nil, operr.Wrap("softrdma", "reg MR", err)
		}
	}
	mr, err := d.place.RegMR(pd.id, buf, access)
	if err != nil {
		return nil, operr.Wrap("softrdma", "reg MR", err)
	}
	return mr, nil
}

// checkReg makes the checks every registration shares.
func (d *Device) checkReg(pd *PD, access Access) error {
	if pd == nil || pd.dev != d {
		return ErrBadPD
	}
	if d.closed() {
		return fmt.Errorf("softrdma: reg MR: %w", transport.ErrClosed)
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return ErrBadAccess
	}
	return nil
}

// DeregMR invalidates the MR's keys, waits for placements in flight through
// it and unpins it (ibv_dereg_mr). A Remap of the MR (or of another MR of
// the device) in progress is waited for first. Errors: an MR of another
// device (EINVAL); ErrMWBound (EINVAL, as rxe_dereg_mr, IBTA 10.6.7.2.6:
// memory windows are bound to it; invalidate or deallocate them first);
// a second DeregMR. On error the MR stays registered.
func (d *Device) DeregMR(mr *MR) error {
	// Remap ends the remap it prepares before it returns; placement
	// refuses DeregMR (EBUSY) while a remap is in progress.
	d.remapMu.Lock()
	defer d.remapMu.Unlock()
	if err := d.place.DeregMR(mr); err != nil {
		return operr.Wrap("softrdma", "dereg MR", err)
	}
	return nil
}

// CreateCQ creates a completion queue holding depth completions
// (ibv_create_cq). depth must be 1 to MaxCQE. After the device's Close,
// once the completions it queued (the flushed WRs') are polled, Poll and
// Wait return ErrClosed.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if d.closed() {
		return nil, fmt.Errorf("softrdma: create CQ: %w", transport.ErrClosed)
	}
	if depth < 1 || depth > MaxCQE {
		return nil, fmt.Errorf("softrdma: create CQ: depth %d (1-%d)", depth, MaxCQE)
	}
	return transport.NewDeviceCQ(d.t, depth), nil
}

// CreateQP creates a queue pair in RESET in pd (ibv_create_qp). Errors:
// ErrBadPD (nil, another device's PD, or a deallocated one); ErrBadAttr for missing CQs, CQs
// of another device, a QP type other than RC, UC and UD, or capacities
// over the device's limits (DeviceAttr).
func (d *Device) CreateQP(pd *PD, init QPInitAttr) (*QP, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	qp, err := d.t.CreateQP(pd.id, &init)
	if err != nil {
		return nil, operr.Wrap("softrdma", "create QP", err)
	}
	return qp, nil
}

// CreateGSIQP creates the device's GSI QP, QP1 (IBTA 13.5.1): a UD QP in
// RESET on which management datagrams arrive. Linux keeps QP1 in the
// kernel (ib_mad); here the connection manager, package rdmacm, owns it.
// Make it ready with InitUD(qp, GSIQKey, psn); it takes and sends
// datagrams with GSIQKey whatever Q_Key its attributes hold (as rxe's
// QP1). Errors: ErrBadPD; an
// invalid capacity (transport.ErrBadAttr); transport.ErrBusy when QP1
// exists (one connection manager per device).
func (d *Device) CreateGSIQP(pd *PD, init QPInitAttr) (*QP, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	init.Type = QPTypeUD
	qp, err := d.t.CreateGSIQP(pd.id, &init)
	if err != nil {
		return nil, operr.Wrap("softrdma", "create GSI QP", err)
	}
	return qp, nil
}

// GSIQKey is the Q_Key of QP1 (IBTA 13.5.1.2, the well-known GSI Q_Key).
// Its high bit makes it a controlled Q_Key: a work request naming it is
// sent with the QP's own Q_Key (IBTA 10.2.5).
const GSIQKey = mad.GSIQKey

// DestroyCQ destroys a completion queue (ibv_destroy_cq); Poll and Wait
// then return ErrBadCQ, and CreateQP refuses it. Errors: ErrBadCQ (nil,
// another device's CQ, destroyed already); EBUSY (errors.Is with
// unix.EBUSY, as ibv_destroy_cq(3)) while a QP uses it: destroy the QP
// first. Its EventCQErr, if not yet returned, is discarded; if returned,
// DestroyCQ waits for its AckAsyncEvent, as DestroyQP does.
func (d *Device) DestroyCQ(cq *CQ) error {
	if err := d.t.DestroyCQ(cq); err != nil {
		return fmt.Errorf("softrdma: %w", err)
	}
	return nil
}

// DestroyQP destroys a QP, flushing its outstanding WRs (ibv_destroy_qp).
// A nil QP, one destroyed already or one of another device is ErrBadQP
// (EINVAL). Its asynchronous events not yet returned are discarded and no
// more are raised; like ibv_destroy_qp, it waits until every event of the
// QP that GetAsyncEvent or PollAsyncEvent returned is acknowledged
// (AckAsyncEvent), so that a goroutine handling one does not find the QP
// destroyed under it.
func (d *Device) DestroyQP(qp *QP) error { return d.t.DestroyQP(qp) }
