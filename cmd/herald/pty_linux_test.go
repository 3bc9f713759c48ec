package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

type ptyPair struct{ master, tty *os.File }

// openPTY opens a pseudo-terminal: writes to tty are a terminal's, read
// back from master.
func openPTY(t *testing.T) ptyPair {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err, "opening /dev/ptmx")
	fd := int(m.Fd()) // #nosec G115 -- a file descriptor fits an int
	require.NoError(t, unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0), "unlocking the pty")
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	require.NoError(t, err, "the pty's number")
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err, "opening the pty's terminal side")
	t.Cleanup(func() { _ = tty.Close(); _ = m.Close() })
	return ptyPair{master: m, tty: tty}
}

// read reads from the master side until it has seen want (10 s at most).
func (p ptyPair) read(t *testing.T, want string) string {
	t.Helper()
	require.NoError(t, p.master.SetReadDeadline(time.Now().Add(10*time.Second)))
	var got strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(got.String(), want) {
		n, err := p.master.Read(buf)
		got.Write(buf[:n])
		require.NoError(t, err, "reading the terminal: %q so far", got.String())
	}
	return got.String()
}
