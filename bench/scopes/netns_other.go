//go:build !linux

package scopes

import (
	"errors"
	"net/netip"

	"github.com/softrdma/softrdma"
)

// Netns is two network namespaces joined by a veth pair (Linux only).
type Netns struct {
	A, B         string
	AddrA, AddrB netip.Addr
}

// NewNetns fails: network namespaces are Linux's.
func NewNetns() (*Netns, error) { return nil, errors.ErrUnsupported }

// Close does nothing.
func (n *Netns) Close() error { return nil }

// OpenIn fails: network namespaces are Linux's.
func OpenIn(ns string, cfg softrdma.Config) (*softrdma.Device, error) {
	return nil, errors.ErrUnsupported
}
