//go:build !linux

package main

import "os"

// terminal reports whether f is a character device: the closest this build
// can tell a terminal from a file or a pipe without termios.
func terminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
