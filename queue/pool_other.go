//go:build !linux

package queue

import (
	"syscall"
	"time"
)

// tcpUserTimeout does nothing where TCP_USER_TIMEOUT is not Linux's.
func tcpUserTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
