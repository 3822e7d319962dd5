package conn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Impairment describes faults a conn injects into its own traffic, for
// tests and experiments. Every decision is drawn from a PCG generator
// seeded with Seed (one stream per direction), so the same seed and the
// same sequence of packets give the same decisions.
//
// Per packet, in this order: Loss drops it; Dup sends it twice; then each
// copy is independently corrupted (Corrupt: one byte flipped, not BTH byte
// 4, which the ICRC masks), delayed (Delay + a uniform [0, Jitter) for a
// DelayProb fraction of packets) or else held back for reordering (Reorder:
// released after 1..ReorderGap later packets have passed, or ReorderHold,
// whichever comes first).
//
// On send, the ICRC is computed after these decisions (a packet's IPv4 ID
// depends on where it lands in a GSO batch) and corruption is applied after
// the ICRC, so that the peer's ICRC check catches it. On receive, the
// impairments act after the ICRC check and corrupted copies are checked
// again, so they are dropped and counted in Stats.BadICRC.
type Impairment struct {
	Loss    float64 // probability that a packet is dropped
	Reorder float64 // probability that a packet is held back behind later ones
	Dup     float64 // probability that a packet is duplicated
	Corrupt float64 // probability that a packet has a byte flipped

	Delay     time.Duration // fixed delay of delayed packets
	Jitter    time.Duration // delayed packets get an extra uniform [0, Jitter)
	DelayProb float64       // fraction of packets delayed; 0 means all when Delay or Jitter is set

	ReorderGap  int           // a reordered packet waits for 1..ReorderGap later packets; 0 means 3
	ReorderHold time.Duration // ... or at most this long; 0 means 1ms

	Seed uint64    // seed of the decisions
	Dir  Direction // directions impaired; 0 means DirBoth
}

// Defaults for the zero values of Impairment.ReorderGap and ReorderHold.
const (
	DefaultReorderGap  = 3
	DefaultReorderHold = time.Millisecond
)

// MaxImpairDelay bounds Delay, Jitter, their sum (the longest a packet is
// held) and ReorderHold: a packet held longer
// than any retransmission timeout (the longest, -u 31, aside) is as good as
// lost, so a longer delay makes no experiment — and it would pin the
// packet's buffer for that long.
const MaxImpairDelay = 10 * time.Second

// Validate reports whether every field is in range.
func (m *Impairment) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"loss", m.Loss}, {"reorder", m.Reorder}, {"dup", m.Dup}, {"corrupt", m.Corrupt}, {"delay-prob", m.DelayProb}} {
		if !(p.v >= 0 && p.v <= 1) { // also rejects NaN
			return fmt.Errorf("conn: impairment %s=%v: not a probability in [0, 1]", p.name, p.v)
		}
	}
	switch {
	case m.Delay < 0:
		return fmt.Errorf("conn: impairment delay=%v: negative", m.Delay)
	case m.Jitter < 0:
		return fmt.Errorf("conn: impairment jitter=%v: negative", m.Jitter)
	case m.ReorderGap < 0:
		return fmt.Errorf("conn: impairment reorder-gap=%d: negative", m.ReorderGap)
	case m.ReorderHold < 0:
		return fmt.Errorf("conn: impairment reorder-hold=%v: negative", m.ReorderHold)
	case m.Delay > MaxImpairDelay:
		return fmt.Errorf("conn: impairment delay=%v: at most %v", m.Delay, MaxImpairDelay)
	case m.Jitter > MaxImpairDelay:
		return fmt.Errorf("conn: impairment jitter=%v: at most %v", m.Jitter, MaxImpairDelay)
	case m.Delay+m.Jitter > MaxImpairDelay:
		return fmt.Errorf("conn: impairment delay=%v,jitter=%v: a packet may be held delay+jitter, at most %v", m.Delay, m.Jitter, MaxImpairDelay)
	case m.ReorderHold > MaxImpairDelay:
		return fmt.Errorf("conn: impairment reorder-hold=%v: at most %v", m.ReorderHold, MaxImpairDelay)
	case m.Dir&^DirBoth != 0:
		return fmt.Errorf("conn: impairment dir=%d: not tx, rx or both", m.Dir)
	}
	return nil
}

func (m *Impairment) dir() Direction {
	if m.Dir == 0 {
		return DirBoth
	}
	return m.Dir
}

func (m *Impairment) reorderGap() int {
	if m.ReorderGap == 0 {
		return DefaultReorderGap
	}
	return m.ReorderGap
}

func (m *Impairment) reorderHold() time.Duration {
	if m.ReorderHold == 0 {
		return DefaultReorderHold
	}
	return m.ReorderHold
}

// String returns the impairment in ParseImpairment's syntax.
func (m *Impairment) String() string {
	if m == nil {
		return "none"
	}
	var b strings.Builder
	add := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	prob := func(k string, v float64) {
		if v != 0 {
			add(k, strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	prob("loss", m.Loss)
	prob("reorder", m.Reorder)
	prob("dup", m.Dup)
	prob("corrupt", m.Corrupt)
	if m.Delay != 0 {
		add("delay", m.Delay.String())
	}
	if m.Jitter != 0 {
		add("jitter", m.Jitter.String())
	}
	prob("delay-prob", m.DelayProb)
	if m.ReorderGap != 0 {
		add("reorder-gap", strconv.Itoa(m.ReorderGap))
	}
	if m.ReorderHold != 0 {
		add("reorder-hold", m.ReorderHold.String())
	}
	add("seed", strconv.FormatUint(m.Seed, 10))
	add("dir", m.dir().String())
	return b.String()
}

// ParseImpairment parses a comma-separated list of key=value pairs, as given
// on the command line:
//
//	loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,delay=2ms,seed=7,dir=both
//
// Keys: loss, reorder, dup, corrupt, delay-prob (probabilities in [0, 1],
// or percentages such as 1%); delay, jitter, reorder-hold (durations);
// reorder-gap (packets); seed (uint64); dir (tx, rx or both; default both).
// "" and "none" give nil. Unknown keys, repeated keys and out-of-range
// values are errors.
func ParseImpairment(s string) (*Impairment, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return nil, nil
	}
	m := &Impairment{Dir: DirBoth}
	seen := map[string]bool{}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, fmt.Errorf("conn: impairment %q: want key=value", kv)
		}
		if seen[k] {
			return nil, fmt.Errorf("conn: impairment: %s given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case "loss":
			m.Loss, err = parseProb(v)
		case "reorder":
			m.Reorder, err = parseProb(v)
		case "dup":
			m.Dup, err = parseProb(v)
		case "corrupt":
			m.Corrupt, err = parseProb(v)
		case "delay-prob":
			m.DelayProb, err = parseProb(v)
		case "delay":
			m.Delay, err = time.ParseDuration(v)
		case "jitter":
			m.Jitter, err = time.ParseDuration(v)
		case "reorder-hold":
			m.ReorderHold, err = time.ParseDuration(v)
		case "reorder-gap":
			m.ReorderGap, err = strconv.Atoi(v)
			if err != nil || m.ReorderGap < 1 {
				err = errors.New("must be a whole number, at least 1")
			}
		case "seed":
			// Not strconv's "strconv.ParseUint: parsing "-1": invalid syntax".
			if m.Seed, err = strconv.ParseUint(v, 0, 64); err != nil {
				err = errors.New("must be a whole number, 0 to 2^64-1")
			}
		case "dir":
			switch v {
			case "tx":
				m.Dir = DirTx
			case "rx":
				m.Dir = DirRx
			case "both":
				m.Dir = DirBoth
			default:
				err = errors.New("want tx, rx or both")
			}
		default:
			return nil, fmt.Errorf("conn: impairment: unknown key %q", k)
		}
		if err != nil {
			return nil, fmt.Errorf("conn: impairment %s=%s: %w", k, v, err)
		}
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseProb(v string) (float64, error) {
	scale := 1.0
	if p, ok := strings.CutSuffix(v, "%"); ok {
		v, scale = p, 100
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, errors.New("not a probability in [0, 1]") // not strconv's "strconv.ParseFloat: parsing ..."
	}
	f /= scale
	if !(f >= 0 && f <= 1) || math.IsInf(f, 0) {
		return 0, errors.New("not a probability in [0, 1]")
	}
	return f, nil
}

// impairer applies an Impairment to one direction of one conn. It is used
// under that direction's lock only.
type impairer struct {
	dir   Direction
	salt  uint64
	stats *ImpairStats
	pool  *bufPool

	cfg *Impairment // in force for this direction, nil if none
	src *Impairment // the Impairment the generator was seeded from
	pcg rand.PCG
	rng *rand.Rand // over pcg

	held []heldItem // packets held back for reordering, in arrival order
	line delayLine  // delayed packets
}

// heldItem is a packet held back by a reorder decision.
type heldItem struct {
	it       item
	left     int       // later packets still to pass before release
	deadline time.Time // release at the latest
}

func (im *impairer) init(dir Direction, stats *ImpairStats, pool *bufPool) {
	im.dir, im.stats, im.pool = dir, stats, pool
	im.salt = 0x7478 // "tx"
	if dir == DirRx {
		im.salt = 0x7278 // "rx"
	}
	im.rng = rand.New(&im.pcg)
}

// begin brings im up to date with the conn's current impairment m. The
// generator is reseeded only when m changes, so a run of batches under one
// Impairment draws one deterministic stream.
func (im *impairer) begin(m *Impairment) {
	if m == im.src {
		return
	}
	im.src = m
	im.cfg = nil
	if m != nil && m.dir()&im.dir != 0 {
		im.cfg = m
		im.pcg.Seed(m.Seed, im.salt)
	}
}

// idle reports whether the impairer would pass packets through untouched.
func (im *impairer) idle() bool { return im.cfg == nil && len(im.held) == 0 && len(im.line.h) == 0 }

// own makes it refer to a conn-owned copy of its bytes.
func (im *impairer) own(it *item) {
	if it.pb == nil {
		it.pb = im.pool.copyOf(it.buf)
		it.buf = it.pb.b
	}
}

// process passes one packet through the impairment and appends what is to
// go out now to out: the packet (unless dropped, delayed or held), its
// duplicate, and held packets whose turn has come.
func (im *impairer) process(out []item, it item, now time.Time) []item {
	m := im.cfg
	if m == nil {
		return im.countdown(append(out, it))
	}
	r := im.rng
	if m.Loss > 0 && r.Float64() < m.Loss {
		im.stats.Dropped.Add(1)
		im.pool.put(it.pb)
		return out
	}
	copies := 1
	if m.Dup > 0 && r.Float64() < m.Dup {
		im.stats.Duplicated.Add(1)
		copies = 2
	}
	for k := range copies {
		c := it
		if k == 1 {
			// Always a copy: on send, two copies in one GSO batch get
			// different IPv4 IDs and so different ICRCs.
			c.pb = nil
			im.own(&c)
		}
		if m.Corrupt > 0 && r.Float64() < m.Corrupt {
			im.own(&c) // never the caller's (or a duplicate's) bytes
			c.corrupt = true
			c.pos = int32(r.IntN(len(c.buf) - 1))
			if c.pos >= 4 { // skip BTH byte 4 (FECN, BECN, Resv6): the ICRC masks it
				c.pos++
			}
			c.mask = byte(1 + r.IntN(255))
			im.stats.Corrupted.Add(1)
		}
		if (m.Delay > 0 || m.Jitter > 0) && (m.DelayProb == 0 || r.Float64() < m.DelayProb) {
			d := m.Delay
			if m.Jitter > 0 {
				d += time.Duration(r.Int64N(int64(m.Jitter)))
			}
			im.own(&c)
			im.line.push(now.Add(d), c)
			im.stats.Delayed.Add(1)
			continue
		}
		if m.Reorder > 0 && r.Float64() < m.Reorder {
			im.held = append(im.held, heldItem{it: c, left: 1 + r.IntN(m.reorderGap()), deadline: now.Add(m.reorderHold())})
			im.stats.Reordered.Add(1)
			continue
		}
		out = im.countdown(append(out, c))
	}
	return out
}

// countdown counts one packet gone out against the held packets and
// appends those whose turn has come.
func (im *impairer) countdown(out []item) []item {
	if len(im.held) == 0 {
		return out
	}
	j := 0
	for _, h := range im.held {
		if h.left--; h.left <= 0 {
			out = append(out, h.it)
			continue
		}
		im.held[j] = h
		j++
	}
	clear(im.held[j:])
	im.held = im.held[:j]
	return out
}

// settle copies held packets that still alias a caller's or a socket's
// buffer; call it before those buffers are given back.
func (im *impairer) settle() {
	for i := range im.held {
		im.own(&im.held[i].it)
	}
}

// due appends to out the delayed and held packets whose time has come.
func (im *impairer) due(out []item, now time.Time) []item {
	for len(im.line.h) > 0 && !im.line.h[0].at.After(now) {
		out = append(out, im.line.pop())
	}
	if len(im.held) == 0 {
		return out
	}
	j := 0
	for _, h := range im.held {
		if !h.deadline.After(now) {
			out = append(out, h.it)
			continue
		}
		im.held[j] = h
		j++
	}
	clear(im.held[j:])
	im.held = im.held[:j]
	return out
}

// next returns when the earliest delayed or held packet is due.
func (im *impairer) next() (time.Time, bool) {
	var t time.Time
	ok := false
	if len(im.line.h) > 0 {
		t, ok = im.line.h[0].at, true
	}
	for _, h := range im.held {
		if !ok || h.deadline.Before(t) {
			t, ok = h.deadline, true
		}
	}
	return t, ok
}

// discard drops every held and delayed packet (on Close), counting them
// in ImpairStats.Discarded.
func (im *impairer) discard() {
	im.stats.Discarded.Add(uint64(len(im.held) + len(im.line.h)))
	for _, h := range im.held {
		im.pool.put(h.it.pb)
	}
	clear(im.held)
	im.held = im.held[:0]
	for len(im.line.h) > 0 {
		im.pool.put(im.line.pop().pb)
	}
}

// delayLine is a min-heap of delayed packets by release time, FIFO among
// equal times.
type delayLine struct {
	h   []delayed
	seq uint64
}

type delayed struct {
	at  time.Time
	seq uint64
	it  item
}

func (d *delayLine) less(i, j int) bool {
	if c := d.h[i].at.Compare(d.h[j].at); c != 0 {
		return c < 0
	}
	return d.h[i].seq < d.h[j].seq
}

func (d *delayLine) push(at time.Time, it item) {
	d.seq++
	d.h = append(d.h, delayed{at: at, seq: d.seq, it: it})
	for i := len(d.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !d.less(i, p) {
			break
		}
		d.h[i], d.h[p] = d.h[p], d.h[i]
		i = p
	}
}

func (d *delayLine) pop() item {
	it := d.h[0].it
	n := len(d.h) - 1
	d.h[0] = d.h[n]
	d.h[n] = delayed{}
	d.h = d.h[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && d.less(l, m) {
			m = l
		}
		if r < n && d.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		d.h[i], d.h[m] = d.h[m], d.h[i]
		i = m
	}
	return it
}
