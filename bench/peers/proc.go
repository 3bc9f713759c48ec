package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/internal/fanoutload"
)

// procCPU is a process's user+system CPU time (0 when it is gone).
func procCPU(pid int) time.Duration {
	f := fanoutload.ProcStat(pid)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	want := strconv.Itoa(pid)
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := fanoutload.ProcStat(n); len(f) > 1 && f[1] == want {
			out = append(out, n)
		}
	}
	return out
}

// child is a server run as a process of its own, so its CPU time is its
// own: this binary started again with a "child" subcommand, or herald.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner // its stdout after the ready line
	addr  string         // what it printed after "ready "
	done  chan error
}

// startChild runs bin with args and waits for a "ready ADDR" line on its
// stdout. Closing its stdin tells a child of this binary to exit.
func startChild(ctx context.Context, bin string, args ...string) (*child, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("piping to %s: %w", bin, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("piping from %s: %w", bin, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		for c.lines.Scan() {
			if a, ok := strings.CutPrefix(c.lines.Text(), "ready "); ok {
				ready <- a
				return
			}
		}
		close(ready)
	}()
	select {
	case a, ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			return nil, fmt.Errorf("%s %v exited before it was ready", bin, args)
		}
		c.addr = a
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("%s %v not ready in 2 minutes", bin, args)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, ctx.Err()
	}
	go func() { c.done <- cmd.Wait() }()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) stop() {
	_ = c.stdin.Close()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		_ = err // a signalled exit is expected
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		err := <-c.done
		_ = err
	}
}
