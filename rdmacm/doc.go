// Package rdmacm is softrdma's connection manager: the InfiniBand
// communication manager (IBTA Vol. 1 chapter 12) on the device's GSI QP
// (QP1), with the RDMA CM IP addressing of IBTA Annex A11, so that
// rdma_cm applications (rping, perftest's -R, anything built on
// librdmacm) connect to softrdma and softrdma to them.
//
// The API follows librdmacm's synchronous calls, one Go call per verb:
//
//	librdmacm                                     rdmacm
//	rdma_create_event_channel + rdma_create_id    Open(dev, Options) -> *CM (one per device: it owns QP1)
//	rdma_bind_addr + rdma_listen                  CM.Listen(port, backlog) -> *Listener
//	rdma_get_request (RDMA_CM_EVENT_CONNECT_REQUEST)  Listener.GetRequest(ctx) -> *ConnRequest
//	rdma_accept (waits for ESTABLISHED)           ConnRequest.Accept(ctx, qp, ConnParam) -> *Conn
//	rdma_reject                                   ConnRequest.Reject(privateData)
//	rdma_resolve_addr + rdma_resolve_route +
//	rdma_connect (waits for ESTABLISHED)          CM.Connect(ctx, qp, dst, ConnParam) -> *Conn
//	rdma_disconnect                               Conn.Disconnect()
//	RDMA_CM_EVENT_DISCONNECTED                    <-Conn.Done()
//
// The application creates the RC QP (in RESET) with softrdma; the CM
// moves it through INIT, RTR and RTS with the attributes the REQ and REP
// carry, as ib_cm's ib_cm_init_qp_attr does, and to ERR on disconnect.
//
// # Messages and states
//
// The active side sends a REQ (ServiceID 0x0000000001060000|port for
// RDMA_PS_TCP; private data: the 36-byte IP CM header, then up to 56
// bytes of the consumer's), the passive side answers REP (or REJ), the
// active side RTU. Either side ends with DREQ, answered by DREP. Each
// message that expects an answer (REQ, REP, DREQ) is sent again after the
// peer's CM response timeout (4.096 µs × 2^20 = 4.3 s by default, as
// rdma_cm's CMA_CM_RESPONSE_TIMEOUT), at most MaxCMRetries (15) times;
// then the connection fails with ErrTimeout (and, for REQ and REP, a REJ
// with reason "timeout" goes to the peer, as ib_cm sends).
//
// Duplicates are answered as Linux's ib_cm answers them: a REQ seen again
// while the application has not decided gets an MRA (service timeout 24,
// 69 s, rdma_cm's CMA_CM_MRA_SETTING), a REP seen again after the RTU
// gets the RTU again, a DREQ for a connection already gone gets a DREP.
//
// What softrdma does not support is refused as the IBTA says: a REQ for a
// port nobody listens on gets REJ "invalid service ID" (8); a REQ for UC,
// RD or XRC (the extended transport type) gets REJ "invalid transport
// type" (9); a REQ with an unknown port space or without the IP CM header
// gets REJ "invalid service ID"; a CM attribute we do not implement (SIDR,
// LAP, APR, ClassPortInfo) gets a GetResp with MAD status 0x000C
// ("unsupported method/attribute combination", IBTA 13.4.7); another
// management class or class version gets status 0x0004 ("bad version").
// Each is counted (Counters) and logged with the peer and what it asked.
//
// # Addresses
//
// RoCEv2 GIDs are IP addresses: the REQ's primary path carries the two
// sides' GIDs (IPv4 as ::ffff:a.b.c.d), LIDs 0xffff. MADs go to the peer
// device's UDP port 4791. A lab device bound to another port (two devices
// on one loopback address) is reached at ConnParam.RoCEPort; the passive
// side answers a MAD at the UDP port it came from when its own device is
// not on 4791 (its peers are lab devices too, which send from their
// listening port), else at 4791.
package rdmacm
