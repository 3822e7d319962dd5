// Package transport is the reliable-connected RDMA engine: per-QP
// requester, responder and completer state machines in the manner of Linux
// rdma_rxe (IBTA Vol. 1 chapter 9, "Transport layer"), driven by batched UDP
// I/O from package conn.
//
// Concurrency. A Device runs two goroutines: the receive loop, which
// decodes every datagram and runs the responder (requests) or the
// completer (acknowledgements and responses) of the destination QP, and the
// send worker, which runs the requesters of the QPs that have work. The
// responder state of a QP (qp.resp) is owned by the receive loop alone. The
// send queue, the requester (qp.req) and the completer (qp.comp) share
// qp.sq.mu, held while packets are built but not while they are sent;
// only the send worker sends request packets, so they leave in PSN order.
package transport
