//go:build unix

package syncnet

import (
	"net"
	"runtime"
	"syscall"
)

// readBuffer is the receive buffer the kernel granted conn; -1 when
// unknown. Linux reports twice the size set, for its bookkeeping.
func readBuffer(conn *net.UDPConn) int {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1
	}
	size := -1
	_ = raw.Control(func(fd uintptr) {
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF); err == nil { // #nosec G115 -- a descriptor
			size = v
		}
	})
	if runtime.GOOS == "linux" && size > 0 {
		size /= 2
	}
	return size
}
