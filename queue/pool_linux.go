package queue

import (
	"syscall"
	"time"
)

// tcpUserTimeoutOpt is TCP_USER_TIMEOUT (linux/tcp.h), which package
// syscall does not name.
const tcpUserTimeoutOpt = 0x12

// tcpUserTimeout sets TCP_USER_TIMEOUT on a dialed socket: data sent and
// not acknowledged for d closes the connection (a host gone mid-write).
func tcpUserTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(network, _ string, c syscall.RawConn) error {
		if network != "tcp" && network != "tcp4" && network != "tcp6" {
			return nil // a Unix socket
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeoutOpt, int(d.Milliseconds())) // #nosec G115 -- small
		})
		if err != nil {
			return err
		}
		return serr
	}
}
