package rdmacm

import (
	"testing"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// FuzzReceive feeds arbitrary MADs to a CM that listens on port 7174 and
// has a connection in every state: nothing panics, and the CM stays
// usable (a later Listen works).
func FuzzReceive(f *testing.F) {
	// Two devices over the in-memory pipe, logging nowhere: testing.F's
	// Logf may not be called while the fuzz target runs, and the devices
	// log from their own goroutines.
	quiet := func(string, ...any) {}
	ca, cb := conn.NewPipe()
	devA, err := softrdma.Open(softrdma.Config{Conn: ca, Logf: quiet})
	if err != nil {
		f.Fatal(err)
	}
	devB, err := softrdma.Open(softrdma.Config{Conn: cb, Logf: quiet})
	if err != nil {
		f.Fatal(err)
	}
	cm, err := Open(devA, Options{Logf: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		cm.Close()
		devA.Close()
		devB.Close()
	})
	src, dst := devB.LocalAddr().Addr(), devA.LocalAddr().Addr()
	if _, err := cm.Listen(7174, 1024); err != nil {
		f.Fatal(err)
	}
	seed := func(attr mad.AttributeID, fill func(data []byte)) {
		b := make([]byte, mad.Size)
		mad.Datagram(b).Encode(&mad.HeaderFields{Class: mad.ClassCM, ClassVersion: mad.CMClassVersion,
			Method: mad.MethodSend, TransactionID: 1, AttributeID: attr})
		fill(b[mad.HeaderSize:])
		f.Add(b, uint32(1))
	}
	seed(mad.AttrREQ, func(d []byte) {
		var pd [mad.REQPrivateDataSize]byte
		mad.IPPrivateData(pd[:]).Encode(&mad.IPPrivateDataFields{SrcPort: 1, SrcIP: src, DstIP: dst})
		mad.REQ(d).Encode(&mad.REQFields{LocalCommID: 5, ServiceID: mad.IPServiceID(mad.PortSpaceTCP, 7174),
			LocalQPN: 0x11, PathMTU: 3, PrivateData: pd[:]})
	})
	seed(mad.AttrREP, func(d []byte) { mad.REP(d).Encode(&mad.REPFields{LocalCommID: 6, RemoteCommID: 5}) })
	seed(mad.AttrRTU, func(d []byte) { mad.RTU(d).Encode(&mad.RTUFields{LocalCommID: 6, RemoteCommID: 5}) })
	seed(mad.AttrREJ, func(d []byte) { mad.REJ(d).Encode(&mad.REJFields{LocalCommID: 6, RemoteCommID: 5, Reason: 28}) })
	seed(mad.AttrMRA, func(d []byte) { mad.MRA(d).Encode(&mad.MRAFields{LocalCommID: 6, RemoteCommID: 5, ServiceTimeout: 31}) })
	seed(mad.AttrDREQ, func(d []byte) { mad.DREQ(d).Encode(&mad.DREQFields{LocalCommID: 6, RemoteCommID: 5}) })
	seed(mad.AttrDREP, func(d []byte) { mad.DREP(d).Encode(&mad.RTUFields{LocalCommID: 6, RemoteCommID: 5}) })
	seed(mad.AttrLAP, func(d []byte) {})
	f.Add([]byte{1}, uint32(0x11))

	f.Fuzz(func(t *testing.T, m []byte, srcQP uint32) {
		b := make([]byte, softrdma.GRHSize+len(m))
		b[20] = 0x45 // IPv4 header at the GRH's last 20 bytes
		copy(b[32:36], []byte{127, 0, 0, 2})
		copy(b[softrdma.GRHSize:], m)
		wc := softrdma.WC{Opcode: softrdma.WCRecv, SrcQP: srcQP & 0xffffff, ByteLen: uint32(len(b)), SrcPort: 4791}
		cm.receive(b, &wc)
	})
}
