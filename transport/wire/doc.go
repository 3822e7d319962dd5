// Package wire implements the RoCEv2 transport headers (InfiniBand
// Architecture Specification Vol. 1 Rel. 1.4, chapter 9, and Annex A17
// "RoCEv2") as typed views over packet bytes, the opcode table from which
// every header offset is derived, wrap-safe 24-bit sequence numbers and the
// invariant CRC.
//
// Views (BTH, RETH, AETH, ...) alias the packet buffer: they allocate nothing
// and are valid only while the buffer is. Building is done with the *Fields
// structs' Encode methods, which write into a caller-owned slice.
package wire
