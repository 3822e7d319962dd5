package exchange

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
)

// perftest's out-of-band exchange (linux-rdma/perftest,
// src/perftest_communication.c), as perftest 4.5-0.17 (VERSION "6.06",
// Debian bookworm) and 25.01 (VERSION "6.24", Debian trixie) speak it over
// TCP without RDMA CM. Every step is ctx_xchg_data: the client writes its
// bytes and then reads the server's, the server reads and then writes, each
// side a fixed number of bytes:
//
//	exchange_versions   16 bytes  VERSION, NUL padded ("6.06\0...")
//	check_sys_data       4 + 4    cycle buffer (the page size) and cache line size, big-endian; both take the max
//	check_mtu            2        the port's active MTU as an ibv_mtu enum in decimal, NUL terminated ("3\0"); both take the min
//	ctx_hand_shake     108 each   KEY_PRINT_FMT_GID: "%04x:%04x:%06x:%06x:%08x:%016Lx:" LID, out_reads, QPN, PSN, rkey, vaddr,
//	                              then the GID as 16 "%02x:", then "%08x:" SRQN and a NUL
//	xchg_bw_reports      5 × 8    size, iterations, BW peak, BW average, message rate (doubles byte-swapped to big-endian)
//
// The tools call ctx_hand_shake with the same message several times as a
// barrier (after moving the QPs to RTR, before and after the run), and
// perftest before pull request #220 (August 2023; 4.5-0.17 has it) wrote
// "done\0" after the last one and closed without reading the peer's.
// perftest_test.go holds the bytes of captures/write_bw.pcap.
//
// With -R (rdma_cm) the same steps cross as RC SENDs on a connection the
// RDMA CM made to the server's port (-p), one SEND per step and side
// (ctx_xchg_data_rdma: rdma_write_data, then rdma_read_data, which
// reposts the one receive, of sizeof(struct pingpong_dest) = 56 bytes);
// the hand shake is then struct pingpong_dest itself, 56 bytes with each
// field big-endian (rdma_write_keys), and nothing follows the last one
// (the "done" was written to the TCP socket only). Perftest's
// RDMACM field selects this; the caller provides a net.Conn whose every
// Write is one SEND (cmchan.Conn). perftest_test.go holds the bytes of
// captures/send_bw_rdmacm.pcap.

// PerftestVersion is the VERSION this side announces: perftest 25.01's.
// The peer's behaviour depends on it only through thresholds that both
// 6.06 and 6.24 pass (5.31: a 2-byte MTU, 5.32: the system data, 5.33:
// 64-bit iteration counts in the reports) and one that neither does
// (6.28: perftest_negotiation.c's parameter negotiation, which softrdma
// does not speak).
const PerftestVersion = "6.24"

// versionSize is sizeof(user_param->version).
const versionSize = 16

// nativeMark follows the NUL of the version string when this side is a
// softrdma tool that can switch to its own exchange (Conn): perftest reads
// the version with atof and ignores what follows the NUL, and a softrdma
// peer that finds the mark answers with it, after which both speak Native.
var nativeMark = [9]byte{'S', 'O', 'F', 'T', 'R', 'D', 'M', 'A', Version}

// KeyMsgSize is KEY_MSG_SIZE_GID: one ctx_hand_shake message, the NUL
// included.
const KeyMsgSize = 108

// PerftestVer is a perftest version string as exchanged (16 bytes).
type PerftestVer [versionSize]byte

// MakePerftestVer returns the version field for s, NUL padded as strncpy
// leaves it, with the softrdma mark after the NUL if native.
func MakePerftestVer(s string, native bool) PerftestVer {
	var v PerftestVer
	copy(v[:versionSize-1], s)
	if n := len(s) + 1; native && n+len(nativeMark) <= versionSize {
		copy(v[n:], nativeMark[:])
	}
	return v
}

// String returns the version up to the first NUL.
func (v PerftestVer) String() string {
	if i := bytes.IndexByte(v[:], 0); i >= 0 {
		return string(v[:i])
	}
	return string(v[:])
}

// Float is the version as perftest compares it (atof: the longest prefix
// that is a number, 0 if none).
func (v PerftestVer) Float() float64 {
	s := v.String()
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		dot = dot || s[end] == '.'
		end++
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s[:end], "."), 64)
	if err != nil {
		return 0
	}
	return f
}

// native reports whether the softrdma mark follows the NUL.
func (v PerftestVer) native() bool {
	n := len(v.String()) + 1
	return n+len(nativeMark) <= versionSize && bytes.Equal(v[n:n+len(nativeMark)], nativeMark[:])
}

// PerftestDest is perftest's struct pingpong_dest as ctx_hand_shake
// carries it.
type PerftestDest struct {
	LID      uint16 // 0 on RoCE
	OutReads uint16 // the READ/atomic depth the sender accepts as responder; the peer uses it as its max_rd_atomic
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits
	RKey     uint32
	VAddr    uint64 // the sender's buffer for this QP
	GID      [16]byte
	SRQN     uint32 // XRC/DC only; 0
	// GIDIndex is the sender's -x (its GID's index); only the rdma_cm
	// form carries it, and perftest does not read it.
	GIDIndex int32
}

// Marshal formats d as KEY_PRINT_FMT_GID, NUL terminated.
func (d *PerftestDest) Marshal() [KeyMsgSize]byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr)
	for _, g := range d.GID {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", d.SRQN)
	var m [KeyMsgSize]byte
	copy(m[:KeyMsgSize-1], b.String()) // every field is printed at its full width: 107 characters
	return m
}

// ErrBadKeys reports a ctx_hand_shake message that does not parse.
var ErrBadKeys = errors.New("exchange: malformed perftest key message")

// CMKeyMsgSize is sizeof(struct pingpong_dest): one ctx_hand_shake
// message over rdma_cm.
const CMKeyMsgSize = 56

// Offsets in the rdma_cm form of struct pingpong_dest (x86-64 layout:
// int lid, out_reads, qpn, psn; unsigned rkey; 4 bytes of padding;
// unsigned long long vaddr; union ibv_gid gid; unsigned srqn; int
// gid_index).
const (
	cmKeyLID      = 0
	cmKeyOutReads = 4
	cmKeyQPN      = 8
	cmKeyPSN      = 12
	cmKeyRKey     = 16
	cmKeyVAddr    = 24 // after 4 bytes of padding, which perftest leaves uninitialized
	cmKeyGID      = 32
	cmKeySRQN     = 48
	cmKeyGIDIndex = 52
)

// MarshalCM returns d as rdma_write_keys sends it over rdma_cm: struct
// pingpong_dest with every field big-endian (htobe32, htobe64), the
// padding zero.
func (d *PerftestDest) MarshalCM() [CMKeyMsgSize]byte {
	var m [CMKeyMsgSize]byte
	binary.BigEndian.PutUint32(m[cmKeyLID:], uint32(d.LID))
	binary.BigEndian.PutUint32(m[cmKeyOutReads:], uint32(d.OutReads))
	binary.BigEndian.PutUint32(m[cmKeyQPN:], d.QPN)
	binary.BigEndian.PutUint32(m[cmKeyPSN:], d.PSN)
	binary.BigEndian.PutUint32(m[cmKeyRKey:], d.RKey)
	binary.BigEndian.PutUint64(m[cmKeyVAddr:], d.VAddr)
	copy(m[cmKeyGID:], d.GID[:])
	binary.BigEndian.PutUint32(m[cmKeySRQN:], d.SRQN)
	binary.BigEndian.PutUint32(m[cmKeyGIDIndex:], uint32(d.GIDIndex))
	return m
}

// ParsePerftestDestCM parses the rdma_cm form of a hand shake (what
// rdma_read_keys reads: every field, the padding ignored). It is strict
// where perftest is not: the LID and out_reads must fit 16 bits, the QPN
// and PSN 24.
func ParsePerftestDestCM(m []byte) (PerftestDest, error) {
	if len(m) != CMKeyMsgSize {
		return PerftestDest{}, fmt.Errorf("%w: %d bytes over rdma_cm, want %d", ErrBadKeys, len(m), CMKeyMsgSize)
	}
	u32 := func(off int) uint32 { return binary.BigEndian.Uint32(m[off:]) }
	lid, out, qpn, psn := u32(cmKeyLID), u32(cmKeyOutReads), u32(cmKeyQPN), u32(cmKeyPSN)
	if lid > 0xffff || out > 0xffff || qpn > 0xffffff || psn > 0xffffff {
		return PerftestDest{}, fmt.Errorf("%w: LID %#x, out_reads %#x, QPN %#x or PSN %#x out of range (%x)",
			ErrBadKeys, lid, out, qpn, psn, m)
	}
	d := PerftestDest{LID: uint16(lid), OutReads: uint16(out), QPN: qpn, PSN: psn, RKey: u32(cmKeyRKey),
		VAddr: binary.BigEndian.Uint64(m[cmKeyVAddr:]), SRQN: u32(cmKeySRQN), GIDIndex: int32(u32(cmKeyGIDIndex))}
	copy(d.GID[:], m[cmKeyGID:])
	return d, nil
}

// ParsePerftestDest parses a KEY_PRINT_FMT_GID message. It is strict where
// perftest's ethernet_read_keys (strtol of each ':'-separated field) would
// read garbage: every field must be hex of at most its width.
func ParsePerftestDest(m []byte) (PerftestDest, error) {
	s := string(m)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(s, ":")
	// 6 fields, 16 GID bytes, the SRQN and the empty string after the last ':'.
	if len(f) != 24 || f[23] != "" {
		return PerftestDest{}, fmt.Errorf("%w: %q", ErrBadKeys, s)
	}
	field := func(i, bits int) uint64 {
		v, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			s = "" // marks the failure
		}
		return v
	}
	var d PerftestDest
	d.LID = uint16(field(0, 16))
	d.OutReads = uint16(field(1, 16))
	d.QPN = uint32(field(2, 24))
	d.PSN = uint32(field(3, 24))
	d.RKey = uint32(field(4, 32))
	d.VAddr = field(5, 64)
	for i := range d.GID {
		d.GID[i] = byte(field(6+i, 8))
	}
	d.SRQN = uint32(field(22, 32))
	if s == "" {
		return PerftestDest{}, fmt.Errorf("%w: %q", ErrBadKeys, m)
	}
	return d, nil
}

// PerftestReport is perftest's struct bw_report_data as xchg_bw_reports
// exchanges it. BW values are in the unit of the report (MB/sec, that is
// MiB/s, or Gb/sec); the receiver prints them as they are.
type PerftestReport struct {
	Size    uint64
	Iters   uint64
	BWPeak  float64
	BWAvg   float64
	MsgRate float64 // Mpps
}

// Perftest is one end of perftest's exchange over a TCP connection.
// Its methods must be called in the order the tool's main does; they are
// not safe for concurrent use.
type Perftest struct {
	c      net.Conn
	client bool
	// Remote is the peer's version, known after ExchangeVersions.
	Remote PerftestVer
	// Timeout bounds each step (0: none). A perftest peer waits for
	// ever; a softrdma client that got stuck should not.
	Timeout time.Duration
	// RDMACM selects perftest's exchange over rdma_cm (-R): c carries
	// each Write as one SEND, the hand shakes are struct pingpong_dest
	// (56 bytes, MarshalCM), and Close writes no "done".
	RDMACM bool
}

// NewPerftest wraps c, the connection a client dialled or a server
// accepted. The caller keeps c; Close closes it.
func NewPerftest(c net.Conn, client bool) *Perftest { return &Perftest{c: c, client: client} }

// xchg is ctx_xchg_data_ethernet: the client writes my and reads len(rem)
// bytes, the server reads and then writes.
func (p *Perftest) xchg(what string, my, rem []byte) error {
	if p.Timeout > 0 {
		p.c.SetDeadline(time.Now().Add(p.Timeout))
		defer p.c.SetDeadline(time.Time{})
	}
	write := func() error {
		if _, err := p.c.Write(my); err != nil {
			return fmt.Errorf("exchange: perftest %s: write: %w", what, err)
		}
		return nil
	}
	read := func() error {
		if _, err := io.ReadFull(p.c, rem); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("exchange: perftest %s: read: %w", what, err)
		}
		return nil
	}
	if p.client {
		if err := write(); err != nil {
			return err
		}
		return read()
	}
	if err := read(); err != nil {
		return err
	}
	return write()
}

// ExchangeVersions is exchange_versions. With offerNative this side adds
// the softrdma mark (a server only if the client's version had it), and it
// returns whether both did: the peer is a softrdma tool and the two switch
// to Native after this step.
func (p *Perftest) ExchangeVersions(offerNative bool) (native bool, err error) {
	var rem PerftestVer
	if p.Timeout > 0 {
		p.c.SetDeadline(time.Now().Add(p.Timeout))
		defer p.c.SetDeadline(time.Time{})
	}
	if p.client {
		my := MakePerftestVer(PerftestVersion, offerNative)
		if _, err := p.c.Write(my[:]); err != nil {
			return false, fmt.Errorf("exchange: perftest version: write: %w", err)
		}
		err = readVersion(p.c, &rem)
		p.Remote = rem
		return err == nil && offerNative && rem.native(), err
	}
	// The server reads first, so it knows whether to answer with the mark.
	if err := readVersion(p.c, &rem); err != nil {
		return false, err
	}
	p.Remote = rem
	native = offerNative && rem.native()
	my := MakePerftestVer(PerftestVersion, native)
	if _, err := p.c.Write(my[:]); err != nil {
		return false, fmt.Errorf("exchange: perftest version: write: %w", err)
	}
	return native, nil
}

// NotPeerError is a peer whose first bytes cannot start a perftest (or
// softrdma) version exchange: something else listens on, or connected to,
// the port (an HTTP server, a port scanner).
type NotPeerError struct {
	Got []byte // what it sent, up to the first byte that cannot be a version's
}

func (e *NotPeerError) Error() string {
	return fmt.Sprintf("exchange: the peer is not a softrdma or perftest tool: it sent %q", e.Got)
}

// readVersion reads the peer's version field, failing with a
// *NotPeerError as soon as what arrived cannot be one (perftest's VERSION
// is digits and dots, NUL terminated within the 16 bytes), so that a peer
// speaking another protocol is refused at once rather than after 16 bytes
// that may never come.
func readVersion(r io.Reader, v *PerftestVer) error {
	n := 0
	for n < versionSize {
		k, err := r.Read(v[n:])
		n += k
		if !versionPrefix(v[:n]) {
			return &NotPeerError{Got: bytes.Clone(v[:n])}
		}
		if err != nil && n < versionSize {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("exchange: perftest version: read: %w", err)
		}
	}
	return nil
}

// versionPrefix reports whether b can begin a version field: a digit,
// then digits and dots up to a NUL (anything after it: the softrdma
// mark), the NUL within the field.
func versionPrefix(b []byte) bool {
	s := b
	if i := bytes.IndexByte(b, 0); i >= 0 {
		s = b[:i]
	} else if len(b) == versionSize {
		return false
	}
	if len(b) > 0 && (len(s) == 0 || s[0] < '0' || s[0] > '9') {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return true
}

// SetDeadline sets the deadline of the connection's reads and writes (the
// zero time: none), to bound several steps together.
func (p *Perftest) SetDeadline(t time.Time) error { return p.c.SetDeadline(t) }

// SysData is check_sys_data: it exchanges the cycle buffer (perftest's
// default is the page size) and the cache line size and returns the
// larger of each side's. A peer older than 5.32 skips it.
func (p *Perftest) SysData(cycleBuffer, cacheLine int) (int, int, error) {
	if p.Remote.Float() < 5.32 {
		return cycleBuffer, cacheLine, nil
	}
	var my, rem [4]byte
	binary.BigEndian.PutUint32(my[:], uint32(cycleBuffer))
	if err := p.xchg("cycle buffer", my[:], rem[:]); err != nil {
		return 0, 0, err
	}
	rc := int(int32(binary.BigEndian.Uint32(rem[:])))
	binary.BigEndian.PutUint32(my[:], uint32(cacheLine))
	if err := p.xchg("cache line", my[:], rem[:]); err != nil {
		return 0, 0, err
	}
	rl := int(int32(binary.BigEndian.Uint32(rem[:])))
	return max(cycleBuffer, rc), max(cacheLine, rl), nil
}

// MTU is check_mtu: it exchanges this side's MTU as an ibv_mtu enum
// (1: 256 bytes ... 5: 4096 bytes) and returns the smaller of the two
// (the peer's only if it is valid). A peer from 5.31 on sends 2 bytes
// (sprintf "%d" and its NUL), an older one sizeof(int).
func (p *Perftest) MTU(mtu int) (int, error) {
	if p.Remote.Float() < 5.1 {
		return mtu, nil
	}
	n := 2
	if p.Remote.Float() < 5.31 {
		n = 4
	}
	my, rem := make([]byte, n), make([]byte, n)
	copy(my, strconv.Itoa(mtu)) // one digit, then NULs
	if err := p.xchg("MTU", my, rem); err != nil {
		return 0, err
	}
	s := string(rem)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	r, err := strconv.Atoi(s)
	if err == nil && r >= 1 && r <= 5 && r < mtu {
		return r, nil
	}
	return mtu, nil
}

// HandShake is ctx_hand_shake with the key message of my: it returns the
// peer's.
func (p *Perftest) HandShake(my *PerftestDest) (PerftestDest, error) {
	if p.RDMACM {
		m := my.MarshalCM()
		var rem [CMKeyMsgSize]byte
		if err := p.xchg("hand shake", m[:], rem[:]); err != nil {
			return PerftestDest{}, err
		}
		return ParsePerftestDestCM(rem[:])
	}
	m := my.Marshal()
	var rem [KeyMsgSize]byte
	if err := p.xchg("hand shake", m[:], rem[:]); err != nil {
		return PerftestDest{}, err
	}
	return ParsePerftestDest(rem[:])
}

// Reports is xchg_bw_reports: size, iterations (4 bytes to a peer older
// than 5.33), BW peak, BW average and message rate, each exchanged in
// turn, big-endian.
func (p *Perftest) Reports(my PerftestReport) (PerftestReport, error) {
	var rem PerftestReport
	u64 := func(what string, v uint64, n int) (uint64, error) {
		a, b := make([]byte, 8), make([]byte, 8)
		binary.BigEndian.PutUint64(a, v)
		if n == 4 {
			binary.BigEndian.PutUint32(a, uint32(v))
		}
		if err := p.xchg(what, a[:n], b[:n]); err != nil {
			return 0, err
		}
		if n == 4 {
			return uint64(binary.BigEndian.Uint32(b)), nil
		}
		return binary.BigEndian.Uint64(b), nil
	}
	f64 := func(what string, v float64) (float64, error) {
		r, err := u64(what, math.Float64bits(v), 8)
		return math.Float64frombits(r), err
	}
	itersSize := 8
	if p.Remote.Float() < 5.33 {
		itersSize = 4
	}
	var err error
	if rem.Size, err = u64("report size", my.Size, 8); err != nil {
		return rem, err
	}
	if rem.Iters, err = u64("report iterations", my.Iters, itersSize); err != nil {
		return rem, err
	}
	if rem.BWPeak, err = f64("report BW peak", my.BWPeak); err != nil {
		return rem, err
	}
	if rem.BWAvg, err = f64("report BW average", my.BWAvg); err != nil {
		return rem, err
	}
	if rem.MsgRate, err = f64("report message rate", my.MsgRate); err != nil {
		return rem, err
	}
	return rem, nil
}

// SendsDone reports whether a perftest of the peer's version writes "done"
// after its last hand shake (ctx_close_connection before perftest pull
// request #220): 6.06 does, 6.24 does not; versions between them are
// taken to be the newer kind from 6.10 on (not checked against a build).
// Over rdma_cm nobody does.
func (p *Perftest) SendsDone() bool { return !p.RDMACM && p.Remote.Float() < 6.10 }

// perftestDone is what ctx_close_connection wrote before pull request #220.
var perftestDone = []byte("done\x00")

// Close ends the exchange as the peer's version does after
// ctx_close_connection's hand shake: "done\0" to a peer that writes it too
// (nobody reads it: perftest closes right after writing), then close.
// It does not wait for the peer: a peer that still writes its "done" after
// this side closed succeeds (the socket got a FIN), and perftest reads
// nothing after the hand shake.
func (p *Perftest) Close(afterHandShake bool) error {
	if afterHandShake && p.SendsDone() {
		p.c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = p.c.Write(perftestDone) // best effort: the peer may have closed already
	}
	return p.c.Close()
}
