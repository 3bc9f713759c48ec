//go:build !unix

package syncnet

import "net"

// readBuffer is unknown on this platform.
func readBuffer(*net.UDPConn) int { return -1 }
