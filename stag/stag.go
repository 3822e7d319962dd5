// Package stag implements the device's steering-tag table: the index space
// from which memory keys (InfiniBand L_Key/R_Key, iWARP STag, RFC 5040
// section 2.1) are handed out, and the one lookup that validates a key
// before any byte is placed, structured as Linux rxe's lookup_mr.
package stag

import (
	"strconv"
	"strings"
)

// STag is a 32-bit steering tag: a 24-bit table index in the high bits and an
// 8-bit consumer key in the low byte. In InfiniBand words it is an L_Key or
// R_Key; iWARP calls the low byte the STag key (RFC 5040 section 2.1). The
// key rolls on every registration of the same index, so a key kept from an
// earlier registration misses.
type STag uint32

// Layout of an STag.
const (
	IndexBits = 24
	KeyBits   = 8
	MaxIndex  = 1<<IndexBits - 1
	keyMask   = 1<<KeyBits - 1
)

// Make builds an STag from an index (the low 24 bits are used) and a key.
func Make(index uint32, key uint8) STag {
	return STag((index&MaxIndex)<<KeyBits | uint32(key))
}

// Index returns the 24-bit table index.
func (s STag) Index() uint32 { return uint32(s) >> KeyBits }

// Key returns the 8-bit consumer key.
func (s STag) Key() uint8 { return uint8(s & keyMask) }

// String formats the STag as the kernel and perftest print keys: 0x%08x.
func (s STag) String() string {
	const hex = "0123456789abcdef"
	var b [10]byte
	b[0], b[1] = '0', 'x'
	for i := 0; i < 8; i++ {
		b[9-i] = hex[(uint32(s)>>(4*i))&0xf]
	}
	return string(b[:])
}

// Access is a set of memory access rights, with the values of libibverbs'
// enum ibv_access_flags (verbs.h) so that flags pass through unchanged.
type Access uint32

// Access rights (libibverbs IBV_ACCESS_*).
const (
	AccessLocalWrite   Access = 1 << 0 // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite  Access = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead   Access = 1 << 2 // IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic Access = 1 << 3 // IBV_ACCESS_REMOTE_ATOMIC
	AccessMWBind       Access = 1 << 4 // IBV_ACCESS_MW_BIND
	AccessZeroBased    Access = 1 << 5 // IBV_ACCESS_ZERO_BASED
	AccessOnDemand     Access = 1 << 6 // IBV_ACCESS_ON_DEMAND

	// AccessRemote is every right that a peer exercises through an rkey.
	AccessRemote = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	// AccessAll is every flag this package knows.
	AccessAll = AccessLocalWrite | AccessRemote | AccessMWBind | AccessZeroBased | AccessOnDemand
)

var accessNames = [...]string{
	"LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC",
	"MW_BIND", "ZERO_BASED", "ON_DEMAND",
}

// Has reports whether a grants every right in need.
func (a Access) Has(need Access) bool { return a&need == need }

// String lists the flags as libibverbs names them without the IBV_ACCESS_
// prefix, joined by '|': "LOCAL_WRITE|REMOTE_READ". No flags is "0".
func (a Access) String() string {
	if a == 0 {
		return "0"
	}
	var parts []string
	for i, name := range accessNames {
		if a&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if rest := a &^ AccessAll; rest != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(rest), 16))
	}
	return strings.Join(parts, "|")
}

// State is the life-cycle state of a table entry (rxe: RXE_MR_STATE_*).
type State uint32

// Entry states.
const (
	// StateFree: the entry has been freed; its index may be reused with a
	// new key. A reader that loaded the entry before the free sees this.
	StateFree State = iota
	// StateInvalid: allocated but not usable: before Validate, after
	// Invalidate (deregistration in progress, LOCAL_INV, Send with
	// Invalidate). Lookups fail with Reason Invalid.
	StateInvalid
	// StateValid: lookups may succeed.
	StateValid
)

func (s State) String() string {
	switch s {
	case StateFree:
		return "free"
	case StateInvalid:
		return "invalid"
	case StateValid:
		return "valid"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Reason says why a lookup or bounds check failed. Inside the engine
// outcomes are values, not errors: the caller maps a Reason to an InfiniBand
// NAK or work-completion status, or to an iWARP Terminate code.
type Reason uint8

// Lookup outcomes, in the order the checks are made.
const (
	OK           Reason = iota
	NoEntry             // index out of range, never allocated, or freed
	KeyMismatch         // the 8-bit key differs: a stale or forged key
	PDMismatch          // the entry belongs to another protection domain
	AccessDenied        // the entry lacks a requested access right
	Invalid             // the entry is allocated but not valid (invalidated)
	OutOfBounds         // [iova, iova+n) is not inside the entry's range
	Suspended           // placement into the entry is paused (Table.Suspend): hold or retry the access
	QPMismatch          // a type 2 memory window presented by a QP other than the one it is bound to (IBTA 10.6.7.2)
)

var reasonNames = [...]string{
	OK:           "ok",
	NoEntry:      "no entry",
	KeyMismatch:  "key mismatch",
	PDMismatch:   "PD mismatch",
	AccessDenied: "access denied",
	Invalid:      "invalid",
	OutOfBounds:  "out of bounds",
	Suspended:    "suspended",
	QPMismatch:   "QP mismatch",
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// RemoteAccessError reports whether a responder that fails a remote (rkey)
// check with this reason answers with a "remote access error" NAK (IBTA
// 9.7.5.2, NAK code 2 of Table 41; work completion IBV_WC_REM_ACCESS_ERR at
// the requester). That is every failure: an unknown, stale or forged key, a
// key of another PD, a missing right, an invalidated region and a range
// outside the region are all R_Key violations (rxe: every lookup_mr or
// mr_check_range failure becomes RESPST_ERR_RKEY_VIOLATION). For local keys
// the same reasons are a local protection error (IBV_WC_LOC_PROT_ERR).
//
// iWARP distinguishes them in the Terminate message (RFC 5040 section 7.4,
// RFC 5041 section 7.2): NoEntry, KeyMismatch and Invalid are "invalid
// STag", PDMismatch "STag not associated with RDMAP stream", AccessDenied
// "access rights violation", OutOfBounds "base or bounds violation".
// QPMismatch (a type 2 window used through another QP) is an R_Key
// violation too (rxe_lookup_mw fails, RESPST_ERR_RKEY_VIOLATION); iWARP
// calls it "STag not associated with RDMAP stream".
//
// Suspended is not an error: the access is paused and is retried when the
// suspension ends (or answered with an RNR NAK).
func (r Reason) RemoteAccessError() bool { return r != OK && r != Suspended }
