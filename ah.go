package softrdma

import (
	"fmt"
	"net/netip"

	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/transport"
	"github.com/softrdma/softrdma/transport/wire"
)

// Unreliable services: UC and UD QPs, address handles.
//
// A UC QP (QPTypeUC) is connected like an RC QP (Connect does it, with
// UC's attributes) and carries SEND and RDMA WRITE, with or without
// immediate, without acknowledgements: a lost packet loses its message.
// A UD QP (QPTypeUD) is made ready with InitUD (a Q_Key and a first PSN)
// and sends datagrams of at most the port's active MTU (DeviceAttr.ActiveMTU:
// 4096, or less on a link with a smaller MTU) to the address handle,
// QPN and Q_Key each work request names; a receive gets the 40-byte GRH
// (ibv_grh: on RoCEv2 the IP header the datagram arrived with) before the
// payload, and its WC has WCWithGRH and the sender's QPN in SrcQP.

// QP types (enum ibv_qp_type).
const (
	QPTypeUC = transport.QPTypeUC
	QPTypeUD = transport.QPTypeUD
)

// QPAttrQKey selects QPAttr.QKey (IBV_QP_QKEY).
const QPAttrQKey = transport.QPAttrQKey

// WCWithGRH is set on every UD receive completion: the buffer starts with
// the 40-byte GRH (IBV_WC_GRH).
const WCWithGRH = transport.WCWithGRH

// GRHSize is the size of the GRH at the head of a UD receive buffer.
const GRHSize = transport.GRHSize

// Errors of UD work requests, for errors.Is.
var (
	ErrBadAH   = transport.ErrBadAH   // missing, destroyed or of another PD
	ErrMsgSize = transport.ErrMsgSize // UD payload above the port's active MTU
)

// ErrBadAHAttr reports an address vector CreateAH cannot use.
var ErrBadAHAttr = transport.ErrBadAHAttr

// AH is an address handle (struct ibv_ah).
type AH = transport.AH

// GlobalRoute is the GRH part of an address vector (struct
// ibv_global_route). On RoCEv2 the DGID is the destination's IP address:
// IPv4-mapped (::ffff:a.b.c.d) or IPv6.
type GlobalRoute struct {
	DGID         [16]byte
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr is an address vector (struct ibv_ah_attr). RoCE needs the GRH:
// IsGlobal must be set. DLID, SL, SrcPathBits and StaticRate are kept for
// the application and mean nothing on RoCEv2; the GRH's hop limit, traffic
// class and flow label are kept but not applied (datagrams leave with TTL
// 64 and TOS 0, as rxe's do: the kernel takes a RoCEv2 hop limit from the
// route). SGIDIndex is not checked: the device has one GID.
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool
	PortNum     uint8 // 1
	// UDPPort is the destination's UDP port; 0 means RoCEv2's 4791. It is
	// not in ibv_ah_attr (a RoCEv2 NIC always sends to 4791); it reaches
	// a softrdma device bound to another port.
	UDPPort uint16
}

// CreateAH creates an address handle in pd (ibv_create_ah). Errors:
// ErrBadPD, and ErrBadAHAttr for an attribute set without the GRH, a port
// other than 1, or a DGID that is not an address of the device's IP
// family.
func (d *Device) CreateAH(pd *PD, attr AHAttr) (*AH, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	if !attr.IsGlobal {
		return nil, fmt.Errorf("%w: RoCE needs the GRH (is_global)", ErrBadAHAttr)
	}
	if attr.PortNum != 1 {
		return nil, fmt.Errorf("%w: port %d (only port 1 exists)", ErrBadAHAttr, attr.PortNum)
	}
	ip := netip.AddrFrom16(attr.GRH.DGID).Unmap()
	ah, err := d.t.CreateAH(pd.id, &transport.AHAttr{
		Dest:     netip.AddrPortFrom(ip, attr.UDPPort),
		HopLimit: attr.GRH.HopLimit, TrafficClass: attr.GRH.TrafficClass, FlowLabel: attr.GRH.FlowLabel,
		SL: attr.SL,
	})
	if err != nil {
		return nil, operr.Wrap("softrdma", "create AH", err)
	}
	return ah, nil
}

// DestroyAH destroys an address handle (ibv_destroy_ah). Work requests
// already posted with it are sent; later posts refuse it (ErrBadAH).
func (d *Device) DestroyAH(ah *AH) error {
	if err := d.t.DestroyAH(ah); err != nil {
		return operr.Wrap("softrdma", "destroy AH", err)
	}
	return nil
}

// AHAttrFor returns the address vector of a peer at addr (its GID as an
// IP address, and its UDP port: 0 or 4791 for a RoCEv2 NIC), with the GRH
// hop limit 64.
func AHAttrFor(addr netip.AddrPort) AHAttr {
	return AHAttr{
		GRH:      GlobalRoute{DGID: addr.Addr().As16(), HopLimit: 64},
		IsGlobal: true, PortNum: 1, UDPPort: addr.Port(),
	}
}

// InitUD moves a UD QP from RESET through INIT and RTR to RTS with Q_Key
// qkey and first send PSN psn: the three ibv_modify_qp calls of
// ibv_ud_pingpong, with the attributes IBTA Table 91 requires of UD
// (P_Key index, port and Q_Key; nothing; the SQ PSN). On error the QP is
// left in the state reached. A nil QP is ErrBadQP, as for Connect; an RC
// or UC QP is ErrBadAttr, before any transition (Connect connects those).
func InitUD(qp *QP, qkey uint32, psn PSN) error {
	if qp == nil {
		return fmt.Errorf("softrdma: init UD: nil QP: %w", ErrBadQP)
	}
	if t := qp.Type(); t != QPTypeUD {
		return fmt.Errorf("softrdma: init UD: QP %d is %v, not UD (Connect connects RC and UC QPs): %w", qp.QPN(), t, ErrBadAttr)
	}
	if err := qp.Modify(&QPAttr{State: QPStateInit, PKeyIndex: 0, Port: 1, QKey: qkey},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey); err != nil {
		return err
	}
	if err := qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState); err != nil {
		return err
	}
	return qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: psn & wire.PSNMask}, QPAttrState|QPAttrSQPSN)
}
