package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// terminal reports whether f is a terminal: it answers the termios request
// (a file, a pipe or /dev/null does not).
func terminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS) // #nosec G115 -- a file descriptor fits an int
	return err == nil
}
