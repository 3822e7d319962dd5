package transport

import "fmt"

// UDP source ports.
//
// RoCEv2 leaves the UDP source port to the sender as flow entropy
// (wire.SourcePort). By default (Config.SourcePort == SourcePortSpread)
// a device gives each QP the port Linux rxe would: wire.QPSourcePort(qpn)
// from creation, and wire.SourcePort(flow label, qpn, dest QPN) from the
// first Modify with an address vector (RC and UC; a UD QP keeps its
// creation port). So QPs spread over 0xC000-0xFFFF as rxe's do, and a
// capture of softrdma against rxe shows the same port in both directions
// of a connection, as rxe against rxe does.
//
// A UDP socket sends from its own port only, so the conn opens a socket
// per port in use (conn.AcquireSourcePort): a QP takes a hold of its port
// when it reaches RTR (a responder's ACKs are its first packets) and gives
// it up on RESET and DestroyQP; QPs whose ports coincide share a socket,
// and the last hold closes it. Taking the hold in Modify keeps the bind
// out of the data path. Receiving stays on the device's own port: peers
// send to it (4791) whatever port we send from.
//
// Devices of one host that want the same port on the same IP share it
// (the sockets set SO_REUSEPORT). A port that cannot be bound (a socket
// without SO_REUSEPORT has it: on one machine, typically another device
// listening on a port in 0xC000-0xFFFF, such as an ephemeral one) makes
// the QP send from the device's own port instead, with a warning
// (rate-limited); the traffic works, only the spreading of that QP is
// lost. Conversely a device that listens on a port
// some device's QP holds as its source port cannot bind it: bind port 0
// (the kernel then picks a free one) or a port below 0xC000, or set
// SourcePort.

// Values of Config.SourcePort besides a port number.
const (
	// SourcePortSpread gives each QP the source port Linux rxe would (the
	// default).
	SourcePortSpread = 0
	// SourcePortOwn sends every packet from the device's own port, the
	// one it receives on.
	SourcePortOwn = -1
)

// qpSource is the QP's source port state, guarded by modifyMu.
type qpSource struct {
	rxe  uint16 // the port rxe would give the QP now
	held uint16 // the port held on the conn (0: none)
	// chosen is the port chosen when the QP last reached a sending state
	// (RTR or later), whether or not it could be held; on says there is
	// one.
	chosen uint16
	on     bool
	// own: always the device's own port (the GSI QP of a lab device).
	own bool
}

// initSourcePort validates cfg.SourcePort and, for a fixed port, takes
// the device's hold of it for the device's lifetime.
func (d *Device) initSourcePort(sport int) error {
	switch {
	case sport == SourcePortSpread:
		d.spread = true
		return nil
	case sport == SourcePortOwn:
		return nil
	case sport < SourcePortOwn || sport > 0xffff:
		return fmt.Errorf("transport: source port %d (0: spread as rxe, -1: the device's own, or 1-65535)", sport)
	}
	if uint16(sport) == d.conn.LocalAddr().Port() {
		return nil // the conn's own socket
	}
	if err := d.conn.AcquireSourcePort(uint16(sport)); err != nil {
		return fmt.Errorf("transport: %w", err)
	}
	d.fixedPort = uint16(sport)
	return nil
}

// sourcePortFor returns the UDP source port the QP's packets carry when a
// port is chosen; 0 stands for the device's own port.
func (qp *QP) sourcePortFor() uint16 {
	if qp.src.own {
		return 0
	}
	if !qp.dev.spread {
		return qp.dev.fixedPort
	}
	return qp.src.rxe
}

// chooseSourcePort makes sure the QP holds the port it should send from,
// now that it is (or stays) in a sending state, and returns the port its
// packets carry (0: the device's own). Called with modifyMu held, before
// sq and rq are locked: holding a new port may bind a socket.
func (qp *QP) chooseSourcePort() uint16 {
	want := qp.sourcePortFor()
	if qp.src.on && qp.src.chosen == want {
		return qp.src.held
	}
	held := uint16(0)
	if qp.dev.spread {
		if err := qp.dev.conn.AcquireSourcePort(want); err != nil {
			if n := qp.dev.sportWarned.Add(1); warnNth(n) {
				qp.dev.logf("softrdma: QP %d sends from UDP port %d instead of rxe's %d: %v",
					qp.qpn, qp.dev.conn.LocalAddr().Port(), want, err)
			}
		} else {
			held = want
		}
	} else {
		held = want // the device holds it
	}
	qp.releaseSourcePort()
	qp.src.held, qp.src.chosen, qp.src.on = held, want, true
	return held
}

// releaseSourcePort gives up the QP's hold of its source port. Called
// with modifyMu held (or by DestroyQP, after the QP left the table).
func (qp *QP) releaseSourcePort() {
	if qp.src.on && qp.dev.spread && qp.src.held != 0 {
		qp.dev.conn.ReleaseSourcePort(qp.src.held)
	}
	qp.src.held, qp.src.chosen, qp.src.on = 0, 0, false
}

// SourcePort returns the UDP source port the QP's packets leave from: the
// one rxe would use (see Config.SourcePort), the configured one, or the
// device's own port. Before RTR it is the one the QP will take.
func (qp *QP) SourcePort() uint16 {
	qp.modifyMu.Lock()
	defer qp.modifyMu.Unlock()
	p := qp.sourcePortFor()
	if qp.src.on {
		p = qp.src.held
	}
	if p == 0 {
		p = qp.dev.conn.LocalAddr().Port()
	}
	return p
}

// sendingState reports whether a QP in state s may send packets (and so
// holds its source port).
func sendingState(s QPState) bool {
	return s == QPStateRTR || s == QPStateRTS || s == QPStateSQD || s == QPStateSQE
}
