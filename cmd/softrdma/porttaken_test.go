package main

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServerPortTakenNotice: a server whose UDP 4791 is taken opens its
// device on another port and says so once prefixed, not "softrdma:
// softrdma: open ...".
func TestServerPortTakenNotice(t *testing.T) {
	const ip = "127.0.0.3"
	hold, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip), Port: 4791})
	if err != nil {
		t.Skipf("cannot hold %s:4791: %v", ip, err)
	}
	defer hold.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())

	var srvCode int
	var srvErr string
	var wg sync.WaitGroup
	wg.Go(func() { srvCode, _, srvErr = runCLI(t, "write-bw", "-p", port, "--bind", ip) })
	var cliCode int
	var cliErr string
	for deadline := time.Now().Add(30 * time.Second); ; {
		cliCode, _, cliErr = runCLI(t, "write-bw", "-n", "5", "-s", "64", "-p", port, "--bind", "127.0.0.1:0", ip)
		if cliCode != exitFail || !strings.Contains(cliErr, "connect to the server") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	require.Equal(t, exitOK, cliCode, cliErr)
	require.Equal(t, exitOK, srvCode, srvErr)
	assert.Contains(t, srvErr, "softrdma: open "+ip+":4791: ")
	assert.Contains(t, srvErr, "; the device uses "+ip+":")
	assert.NotContains(t, srvErr, "softrdma: softrdma:")
}
