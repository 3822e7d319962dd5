package softrdma_test

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestPcapOfEveryOpcodeDecodesInTshark drives every RC opcode (and ACK,
// NAK and RNR NAK) through a pair on the in-memory pipe, whose ends are
// 127.0.0.1:4791 and 127.0.0.2:4791, captures it, and asks Debian's tshark
// to decode the file: every frame must be InfiniBand with no malformed
// packet and no expert error, and every opcode must appear.
func TestPcapOfEveryOpcodeDecodesInTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt-get install -y tshark; .ci/run installs it)")
	}
	path := filepath.Join(t.TempDir(), "every-opcode.pcap")
	t.Run("traffic", func(t *testing.T) { synctest.Test(t, func(t *testing.T) { everyOpcode(t, path) }) })
	checkTshark(t, tshark, path)
}

func everyOpcode(t *testing.T, path string) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, PcapPath: path,
		Connect: softrdma.ConnectOptions{MTU: softrdma.MTU1024, MinRNRTimer: 1}})
	src, smr := reg(t, p.A, 3*1024+100, rw)
	dst, dmr := reg(t, p.B, 3*1024+100, rw)
	_ = src
	sge := func(n int) []softrdma.SGE {
		return []softrdma.SGE{{Addr: smr.Addr(), Length: uint32(n), LKey: smr.LKey()}}
	}
	post := func(wr softrdma.SendWR) softrdma.WC {
		t.Helper()
		wr.Flags |= softrdma.SendSignaled
		_, err := p.A.QP.PostSend(wr)
		require.NoError(t, err)
		return waitWC(t, p.A.CQ, 1)[0]
	}
	recv := func() {
		_, err := p.B.QP.PostRecv(softrdma.RecvWR{SGL: []softrdma.SGE{{Addr: dmr.Addr(), Length: uint32(len(dst)), LKey: dmr.LKey()}}})
		require.NoError(t, err)
	}
	// SEND with Invalidate names a fast-registration MR of B, registered
	// again before each one (a key that cannot be invalidated is a class
	// J error).
	fr, err := p.B.Dev.AllocMR(p.B.PD, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeregMR(fr) })
	invKey := func() uint32 {
		require.NoError(t, p.B.Dev.MapMR(fr, make([]byte, 64)))
		key := softrdma.IncRKey(fr.LKey())
		_, err := p.B.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRRegMR,
			Reg: softrdma.RegWR{MR: fr, Key: key, Access: softrdma.AccessLocalWrite | softrdma.AccessRemoteWrite}})
		require.NoError(t, err)
		synctest.Wait() // B's requester has run the REG_MR
		return key
	}
	big, small := 3*1024+100, 100
	for _, n := range []int{big, small} { // FIRST/MIDDLE/LAST and ONLY
		require.Equal(t, softrdma.WCSuccess, post(softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, SGL: sge(n), RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}).Status)
		recv()
		require.Equal(t, softrdma.WCSuccess, post(softrdma.SendWR{Opcode: softrdma.WRRDMAWriteWithImm, ImmData: 1, SGL: sge(n), RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}).Status)
		for _, op := range []softrdma.WROpcode{softrdma.WRSend, softrdma.WRSendWithImm, softrdma.WRSendWithInv} {
			recv()
			var inv uint32
			if op == softrdma.WRSendWithInv {
				inv = invKey()
			}
			require.Equal(t, softrdma.WCSuccess, post(softrdma.SendWR{Opcode: op, ImmData: 2, InvRKey: inv, SGL: sge(n)}).Status)
		}
		require.Equal(t, softrdma.WCSuccess, post(softrdma.SendWR{Opcode: softrdma.WRRDMARead, SGL: sge(n), RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}).Status)
	}
	one := []softrdma.SGE{{Addr: smr.Addr(), Length: 8, LKey: smr.LKey()}}
	require.Equal(t, softrdma.WCSuccess, post(softrdma.SendWR{Opcode: softrdma.WRAtomicCmpAndSwp, SGL: one, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}).Status)
	require.Equal(t, softrdma.WCSuccess, post(softrdma.SendWR{Opcode: softrdma.WRAtomicFetchAndAdd, SGL: one, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}).Status)
	// An RNR NAK, then the receive arrives.
	_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled, SGL: sge(small)})
	require.NoError(t, err)
	synctest.Wait() // the RNR NAK went out; the requester waits on its timer
	require.NotZero(t, p.B.Dev.Counters().SendRNRErr.Load())
	recv()
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	// A remote access error NAK (bad rkey) ends the test.
	require.Equal(t, softrdma.WCRemAccessErr, post(softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, SGL: sge(small), RemoteAddr: dmr.Addr(), RKey: dmr.RKey() ^ 0x80}).Status)
}

func checkTshark(t *testing.T, tshark, path string) {
	out, err := exec.Command(tshark, "-r", path, "-T", "fields", "-E", "separator=|",
		"-e", "frame.protocols", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", "_ws.expert").CombinedOutput()
	require.NoError(t, err, "%s", out)
	seen := map[string]bool{}
	frames := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(line, "Running as user") {
			continue
		}
		f := strings.Split(line, "|")
		require.Len(t, f, 4, line)
		require.Contains(t, f[0], "infiniband", "frame %d not decoded as InfiniBand: %s", frames+1, line)
		require.Empty(t, f[2], "malformed: %s", line)
		require.Empty(t, f[3], "expert info: %s", line)
		seen[f[1]] = true
		frames++
	}
	// Every RC opcode of IBTA Table 38 (decimal, as tshark prints them).
	for op := 0; op <= 0x17; op++ {
		if op == 0x15 {
			continue // reserved
		}
		require.True(t, seen[strconv.Itoa(op)], "opcode 0x%02x not in the capture", op)
	}
	t.Logf("%d frames, opcodes %v", frames, seen)
}
