package wire

// UDP source ports (Annex A17). RoCEv2 fixes the destination port
// (4791) and leaves the source port to the sender as flow entropy: routers
// and NICs hash the 5-tuple to pick a link or a receive queue, so different
// QPs may take different paths, while every packet of one QP carries the
// same source port and stays in order.
//
// Linux's convention, which rxe follows and which the golden captures
// show (TestGoldenSourcePorts):
//
//   - At QP creation (rxe_qp_init_req in drivers/infiniband/sw/rxe/rxe_qp.c)
//     a QP gets QPSourcePort(qpn): 0xC000 plus a 14-bit multiplicative hash
//     of its QPN (the kernel's hash_32). UD QPs keep it (their modify has
//     no address vector), and so do QP1's CM datagrams: 55410.
//   - A modify with an address vector that has a GRH, which every RoCE
//     address vector has (rxe_modify_qp in rxe_verbs.c), replaces it with
//     SourcePort(flow label, QPN, destination QPN) (rdma_get_udp_sport in
//     include/rdma/ib_verbs.h): the flow label folded to 14 bits, or, when
//     the flow label is 0 (ibverbs tools: rc_pingpong, perftest), one
//     derived from the product of the two QPNs, which both ends compute
//     alike (QP 0x11 to QP 0x11: 49441). The RDMA CM puts a flow label in
//     its REQ, and both ends use it (rping: 0x48e0f, port 52765).

// Specification constants of the source port.
const (
	// SourcePortMin is the first port of the range RoCEv2 source ports
	// are drawn from, the dynamic ports 0xC000-0xFFFF (Linux:
	// IB_ROCE_UDP_ENCAP_VALID_PORT_MIN, rxe: RXE_ROCE_V2_SPORT).
	SourcePortMin = 0xC000
	// FlowLabelMask masks the 20 bits of an IPv6 / GRH flow label.
	FlowLabelMask = 0x000fffff

	sourcePortBits = 14 // SourcePortMin + 14 bits = 0xC000-0xFFFF
	goldenRatio32  = 0x61C88647
)

// QPSourcePort returns the UDP source port rxe gives QP qpn when it is
// created: SourcePortMin plus the top 14 bits of qpn times 2^32/phi (the
// kernel's hash_32(qpn, 14)).
func QPSourcePort(qpn QPN) uint16 {
	h := (uint32(qpn) * goldenRatio32) >> (32 - sourcePortBits)
	return uint16(SourcePortMin | h)
}

// FlowLabel returns the flow label Linux derives for a connection between
// QPs lqpn and rqpn when the address vector has none
// (rdma_calc_flow_label): their product folded to 20 bits. It is
// symmetric, so both ends of a connection compute the same one.
func FlowLabel(lqpn, rqpn QPN) uint32 {
	v := uint64(lqpn&QPNMask) * uint64(rqpn&QPNMask)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v & FlowLabelMask)
}

// FlowLabelSourcePort folds a 20-bit flow label into a source port
// (rdma_flow_label_to_udp_sport): its top 6 bits are XORed into its low
// 14, above SourcePortMin.
func FlowLabelSourcePort(fl uint32) uint16 {
	lo, hi := fl&0x3fff, fl&0xfc000
	lo ^= hi >> sourcePortBits
	return uint16(lo | SourcePortMin)
}

// SourcePort returns the UDP source port of a connected QP (RC, UC)
// numbered lqpn whose address vector has flow label fl and which sends to
// QP rqpn, as rxe computes it when the QP is modified with an address
// vector (rdma_get_udp_sport): FlowLabelSourcePort of fl, or of
// FlowLabel(lqpn, rqpn) when fl is 0.
func SourcePort(fl uint32, lqpn, rqpn QPN) uint16 {
	fl &= FlowLabelMask
	if fl == 0 {
		fl = FlowLabel(lqpn, rqpn)
	}
	return FlowLabelSourcePort(fl)
}
