//go:build !linux

package conn

import "errors"

// UDPConn is a Conn over a UDP socket. It is implemented on Linux only:
// elsewhere Listen fails with errors.ErrUnsupported (use NewPipe).
type UDPConn struct{ core }

// Listen opens a UDP conn. It is implemented on Linux only.
func Listen(cfg Config) (*UDPConn, error) { return nil, errors.ErrUnsupported }

func (c *UDPConn) Send([]Packet) error           { return errors.ErrUnsupported }
func (c *UDPConn) Receive([]Packet) (int, error) { return 0, errors.ErrUnsupported }
func (c *UDPConn) Close() error                  { return nil }
func (c *UDPConn) Wake()                         {}
func (c *UDPConn) Offload() (gso, gro bool)      { return false, false }
func (c *UDPConn) SocketBuffers() (rcv, snd int) { return 0, 0 }
func (c *UDPConn) RecvQueue() (RecvQueue, error) { return RecvQueue{}, errors.ErrUnsupported }
