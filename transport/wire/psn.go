package wire

// PSN is a 24-bit packet sequence number (IBTA 9.7.1). All arithmetic is
// modulo 2^24; never compare two PSNs with < or >, use Before and Distance.
type PSN uint32

// MSN is the 24-bit message sequence number carried in the AETH
// (IBTA 9.7.5.1.2). It wraps like a PSN.
type MSN uint32

// QPN is a 24-bit queue pair number (IBTA 9.2.7, BTH DestQP).
type QPN uint32

const (
	// PSNMask masks a value to the 24 bits of a PSN, MSN or QPN.
	PSNMask = 0x00ffffff
	// QPNMask masks a value to the 24 bits of a QPN.
	QPNMask = 0x00ffffff
	// PSNHalfSpace is 2^23: a PSN q is "after" p when 0 < q-p < 2^23
	// (IBTA 9.7.1, the valid and duplicate regions each span half of the
	// PSN space).
	PSNHalfSpace = 1 << 23
)

// Add returns p+n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns p-n modulo 2^24.
func (p PSN) Sub(n uint32) PSN { return PSN((uint32(p) - n) & PSNMask) }

// Distance returns the signed number of steps from p to q, in
// [-2^23, 2^23): positive when q is after p.
func (p PSN) Distance(q PSN) int32 {
	return int32((uint32(q)-uint32(p))<<8) >> 8
}

// Before reports whether p comes strictly before q in sequence space.
func (p PSN) Before(q PSN) bool { return p.Distance(q) > 0 }

// BeforeEq reports whether p comes before q or equals it.
func (p PSN) BeforeEq(q PSN) bool { return p.Distance(q) >= 0 }

// InWindow reports whether p lies in [first, first+size).
func (p PSN) InWindow(first PSN, size uint32) bool {
	return (uint32(p)-uint32(first))&PSNMask < size
}

// Add returns m+n modulo 2^24.
func (m MSN) Add(n uint32) MSN { return MSN((uint32(m) + n) & PSNMask) }

// Distance returns the signed number of steps from m to n (see PSN.Distance).
func (m MSN) Distance(n MSN) int32 { return int32((uint32(n)-uint32(m))<<8) >> 8 }
