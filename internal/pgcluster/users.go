package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Every Cluster handle holds a shared flock on Dir/users.lock. Release uses
// it to tell whether any other process still uses the postmaster: if it can
// turn its lock exclusive, nobody else holds one. The kernel drops the locks
// of a process that dies, so a crashed user is never counted.

func shareUsers(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "users.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening users lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("taking users lock: %w", err)
	}
	return f, nil
}

// Release ends this handle's use of the cluster and stops the postmaster if
// no other handle, in this or another process, still uses it, whether or not
// this handle started it. So the last of several servers sharing one private
// cluster stops it, and a postmaster left by a crashed server is stopped by
// the next one to exit. It reports whether it stopped the postmaster. Calling
// it again does nothing.
func (c *Cluster) Release(ctx context.Context) (stopped bool, err error) {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	c.stopping.Store(true) // whoever stops it, Supervise must not bring it back
	if c.users == nil {
		return false, nil
	}
	defer func() {
		_ = c.users.Close()
		c.users = nil
	}()
	// The start lock keeps a concurrent Start from reusing the postmaster
	// while it is being stopped.
	unlock, err := lockDir(ctx, c.srv.dir)
	if err != nil {
		return false, err
	}
	defer unlock()
	if err := syscall.Flock(int(c.users.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false, nil // someone else still uses it
	}
	return true, c.stop()
}
