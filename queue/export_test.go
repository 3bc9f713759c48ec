package queue

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
)

// AckResolveSQL is exported for the plan test.
const AckResolveSQL = ackResolveSQL

// PopLockSQL is a wildcard pop's claim statement over one queue by name
// ($1), for the plan tests: parameters as popFilter, $5 group, $6 limit.
var PopLockSQL = fmt.Sprintf(popLockSQL, popFilter(&PopRequest{Queue: "x"}), "")

// PreflightSQL is exported for the plan tests.
var PreflightSQL = preflightSQL

var TxLockConsumersSQL = txLockConsumersSQL

// AckQueued is how many Ack calls wait for a turn in a merged transaction.
func (s *Store) AckQueued() int {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return len(s.acks.queue)
}

// AckRunning is how many ack transactions are in flight.
func (s *Store) AckRunning() int {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.running
}

// PopAssignedSQL is exported for the plan tests.
var PopAssignedSQL = popAssignedSQL

// Retention's statements, for the lock-order tests.
const (
	RetentionCursorsSQL = retentionCursorsSQL
	DonePrefixSQL       = donePrefixSQL
	CleanPartitionsSQL  = cleanPartitionsSQL
)

// SetRetentionHook makes retention call f at each step of a delete batch
// ("locked", "deleted": see retentionHook) until the test ends.
func SetRetentionHook(t testing.TB, f func(step string)) {
	retentionHook = f
	t.Cleanup(func() { retentionHook = nil })
}

// GroupRegisterSQL is exported for the plan tests.
var GroupRegisterSQL = groupRegisterSQL

// SeekSQL and GroupResetSQL are exported for the plan tests.
var (
	SeekSQL       = seekSQL
	GroupResetSQL = groupResetSQL
)

// BackendPID is the instance lock's backend, for the tests that end it.
func (l *InstanceLock) BackendPID() uint32 { return l.pid.Load() }

// SetDatabaseStarted makes the lock take its database's postmaster to have
// started at started, as if it had been held on another server.
func (l *InstanceLock) SetDatabaseStarted(started string) { l.started.Store(&started) }

// LockSocketKeepAlive reads the keepalive options of the lock's TCP socket:
// SO_KEEPALIVE, then TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT (seconds,
// seconds, probes).
func (l *InstanceLock) LockSocketKeepAlive() (on bool, idle, interval, count int, err error) {
	tc := connUnder[*net.TCPConn](l.conn.PgConn().Conn())
	if tc == nil {
		return false, 0, 0, 0, fmt.Errorf("the lock's connection is a %T, not TCP", l.conn.PgConn().Conn())
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false, 0, 0, 0, err
	}
	var serr error
	cerr := raw.Control(func(fd uintptr) {
		get := func(level, opt int) int {
			v, e := syscall.GetsockoptInt(int(fd), level, opt)
			if e != nil && serr == nil {
				serr = e
			}
			return v
		}
		on = get(syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) != 0
		idle = get(syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
		interval = get(syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL)
		count = get(syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT)
	})
	return on, idle, interval, count, errors.Join(cerr, serr)
}
