package softrdma

import (
	"fmt"
	"net/netip"

	"github.com/softrdma/softrdma/transport/wire"
)

// Endpoint is what two sides of an RC connection tell each other out of
// band before they connect (perftest and ibv_rc_pingpong exchange LID,
// QPN, PSN and GID over TCP): the peer's UDP address (its GID, and port
// 4791 if 0), its QPN and its first PSN.
type Endpoint struct {
	Addr netip.AddrPort
	QPN  QPN
	PSN  PSN
}

// ConnectOptions are the connection attributes; a zero field takes the
// default named on it (perftest's values where perftest has one).
type ConnectOptions struct {
	MTU         MTU    // path MTU; default the device's active MTU (from the link MTU, as rxe)
	Access      Access // qp_access_flags; default REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC
	Timeout     uint8  // local ACK timeout exponent; default 14 (67 ms), as perftest
	RetryCnt    uint8  // default 7 (retry forever, as rxe treats 7)
	RNRRetry    uint8  // default 7 (retry forever)
	MinRNRTimer uint8  // encoded, default 12 (0.64 ms), as perftest
	MaxRdAtomic uint8  // max_rd_atomic and max_dest_rd_atomic; default 16
	// Exact uses every field as given, zeros included (e.g. RetryCnt 0 to
	// get RETRY_EXC_ERR at the first timeout).
	Exact bool
}

func (o ConnectOptions) withDefaults() ConnectOptions {
	if o.Exact {
		return o
	}
	if o.MTU == 0 {
		o.MTU = MTU4096
	}
	if o.Access == 0 {
		o.Access = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	}
	if o.Timeout == 0 {
		o.Timeout = 14
	}
	if o.RetryCnt == 0 {
		o.RetryCnt = 7
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = 7
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = 12
	}
	if o.MaxRdAtomic == 0 {
		o.MaxRdAtomic = 16
	}
	return o
}

// Connect moves a QP from RESET through INIT and RTR to RTS towards
// remote, with localPSN as its first send PSN: the three ibv_modify_qp
// calls of ibv_rc_pingpong and perftest, with their required attributes
// (IBTA Table 91). A UC QP gets UC's attributes only (ibv_uc_pingpong's
// calls: no timeout, retries, RNR timer or READ/atomic credits). On error
// the QP is left in the state reached; a nil QP is ErrBadQP, and a UD QP
// ErrBadAttr, before any transition (InitUD brings one up).
func Connect(qp *QP, remote Endpoint, localPSN PSN, o ConnectOptions) error {
	if qp == nil {
		return fmt.Errorf("softrdma: connect: nil QP: %w", ErrBadQP)
	}
	if qp.Type() == QPTypeUD {
		return fmt.Errorf("softrdma: connect: QP %d is UD, which is not connected (InitUD, then an address handle for each send): %w",
			qp.QPN(), ErrBadAttr)
	}
	if o.MTU == 0 && !o.Exact {
		o.MTU = qp.ActiveMTU() // the port's, as perftest takes it
	}
	o = o.withDefaults()
	if remote.Addr.Port() == 0 {
		remote.Addr = netip.AddrPortFrom(remote.Addr.Addr(), wire.RoCEv2Port)
	}
	if qp.Type() == QPTypeUC {
		return connectUC(qp, remote, localPSN, o)
	}
	if err := qp.Modify(&QPAttr{State: QPStateInit, PKeyIndex: 0, Port: 1, AccessFlags: o.Access},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags); err != nil {
		return err
	}
	if err := qp.Modify(&QPAttr{
		State: QPStateRTR, Dest: remote.Addr, PathMTU: o.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN,
		MaxDestRdAtomic: o.MaxRdAtomic, MinRNRTimer: o.MinRNRTimer,
	}, QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer); err != nil {
		return err
	}
	return qp.Modify(&QPAttr{
		State: QPStateRTS, SQPSN: localPSN, Timeout: o.Timeout, RetryCnt: o.RetryCnt,
		RNRRetry: o.RNRRetry, MaxRdAtomic: o.MaxRdAtomic,
	}, QPAttrState|QPAttrSQPSN|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrMaxQPRdAtomic)
}

// connectUC is Connect for a UC QP.
func connectUC(qp *QP, remote Endpoint, localPSN PSN, o ConnectOptions) error {
	if err := qp.Modify(&QPAttr{State: QPStateInit, PKeyIndex: 0, Port: 1, AccessFlags: o.Access},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags); err != nil {
		return err
	}
	if err := qp.Modify(&QPAttr{State: QPStateRTR, Dest: remote.Addr, PathMTU: o.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN); err != nil {
		return err
	}
	return qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: localPSN}, QPAttrState|QPAttrSQPSN)
}
