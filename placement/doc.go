// Package placement turns decoded RDMA requests into memory effects: it
// registers memory regions (key, translation table, pinning), and places or
// fetches the bytes of RDMA WRITE, READ, atomics, SEND receives and the
// requester's gathers through them, after the key, PD, access and bounds
// checks of the InfiniBand Architecture Specification (Vol. 1, chapter 10.6
// memory management; chapter 9.7 responder checks) as Linux rxe makes them.
//
// # Scopes
//
// A remote access is message-scoped: the transport resolves the R_Key once,
// at the FIRST or ONLY packet that carries the RETH (Begin, as rxe's
// check_rkey), checks the whole DMA length against the region, then places
// each packet's payload at the cursor (Write/Read) and releases the region at
// the end of the message (End). Local accesses (SGLs) are call-scoped.
//
// # Outcomes
//
// Data-path calls return a Status, never an error, and allocate nothing. The
// transport maps a Status to what it sends and completes with:
//
//	call            Status           responder sends              WC status
//	Begin/Write/    RemoteAccessErr  NAK remote access error      requester: REM_ACCESS_ERR
//	Read/Atomic     InvalidRequest   NAK invalid request          requester: REM_INV_REQ_ERR
//	Scatter (recv)  LocalProtErr     NAK remote operational error responder: LOC_PROT_ERR; requester: REM_OP_ERR
//	Scatter (recv)  LocalLenErr      NAK invalid request          responder: LOC_LEN_ERR;  requester: REM_INV_REQ_ERR
//	Scatter (READ   LocalProtErr     -                            requester: LOC_PROT_ERR
//	  response,     LocalLenErr      -                            requester: LOC_LEN_ERR
//	  atomic ack)
//	Gather, CheckSGL LocalProtErr    -                            requester: LOC_PROT_ERR
//	any             WouldFault       hold the packet (or RNR NAK) and retry after the fault (ODP, issue 3)
//
// NAK codes are IBTA 9.7.5.1 Table 41 (wire.SyndromeNAK*); the classes follow
// rxe_resp.c (R_Key violations and length errors are class C NAKs on RC).
//
// # Concurrency
//
// An Engine is safe for concurrent use. A Cursor belongs to one goroutine
// (the QP's responder). The data path takes no lock. After invalidating a
// key, DeregMR waits for the placements in flight before it unpins: an
// unbound cursor, Gather, Scatter and Atomic count a reference on the key's
// table entry, which DeregMR drains; a cursor bound to a Reader (a receive
// loop) counts nothing, and DeregMR waits until every Reader that was
// placing has quiesced (RCU-style). Either way the next packet of a message
// whose key was invalidated fails and places nothing.
package placement
