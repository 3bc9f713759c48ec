package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
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
	stopProcess(c.cmd, c.done)
}

// stopProcess sends cmd's process SIGTERM and waits for its exit on done
// (where cmd.Wait's error arrives); past 30 s it kills it.
func stopProcess(cmd *exec.Cmd, done <-chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		_ = err // a signalled exit is expected
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		err := <-done
		_ = err
	}
}

// childSys is the parent's side of a server that is a child of this
// binary reached over HTTP (centrifuge, the floor): the process, a client
// with room for the benchmark's concurrent posts, and a counter that
// makes each run's channel or stream name new.
type childSys struct {
	ch   *child
	http *http.Client
	n    int
}

// startChildSys starts this binary (self) as "child" with args (its kind
// first).
func startChildSys(ctx context.Context, self string, args ...string) (childSys, error) {
	ch, err := startChild(ctx, self, append([]string{"child"}, args...)...)
	if err != nil {
		return childSys{}, err
	}
	return childSys{ch: ch, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64},
		Timeout: time.Minute}}, nil
}

func (s *childSys) cpu() (time.Duration, time.Duration) { return procCPU(s.ch.pid()), 0 }

func (s *childSys) close() { s.ch.stop() }

// post sends p to path on the child; what names the act in errors.
func (s *childSys) post(ctx context.Context, path, what string, p []byte) error {
	_, err := call(ctx, s.http, http.MethodPost, "http://"+s.ch.addr+path, p, http.StatusOK, what)
	return err
}

// call sends body (JSON; none when nil) to url with method and returns
// the answer's body; an answer but want is an error, and what names the
// act in errors.
func call(ctx context.Context, c *http.Client, method, url string, body []byte, want int, what string) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, fmt.Errorf("building a request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = res.Body.Close() }()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		return b, fmt.Errorf("%s: %s %s", what, res.Status, b)
	}
	return b, nil
}

// serveChild is a child server's tail: it serves h on a loopback port,
// tells the parent its address (the "ready ADDR" line startChild waits
// for) and returns, with the server still serving, when the parent stops
// it (waitParent).
func serveChild(h http.Handler) (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println("ready " + ln.Addr().String())
	waitParent()
	return srv, nil
}
