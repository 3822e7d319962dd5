// Package mad implements InfiniBand management datagrams (MADs, IBTA Vol. 1
// Rel. 1.4 section 13.4) as RoCEv2 carries them to the GSI (QP1), the
// communication manager's messages REQ, MRA, REJ, REP, RTU, DREQ and DREP
// (IBTA chapter 12, section 12.6), and the RDMA CM IP private data of a REQ
// (IBTA Annex A11, "RDMA IP CM Service").
//
// As in package wire, every structure is a typed view over the packet bytes
// (Datagram, REQ, REP, ..., IPPrivateData): getters named after the IBTA
// field, allocation-free, valid only while the buffer is. Each view has a
// *Fields struct; Decode fills it from the view and Encode writes it into a
// caller-owned buffer, every bit, reserved bits zero.
//
// A MAD is 256 bytes: a 24-byte common header and 232 bytes of class data.
// On RoCEv2 it is the payload of a UD SEND_ONLY to QP1 with Q_Key
// 0x80010000:
//
//	Ethernet | IP | UDP 4791 | BTH (DestQP 1) | DETH | MAD (256) | ICRC
//
// Parse checks the length and the base version; the CM views need the
// class data of a Datagram whose Class is ClassCM and ClassVersion
// CMClassVersion (see Datagram.CM).
package mad
