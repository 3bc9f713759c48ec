package main

import (
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/internal/benchstat"
)

// loopbackPairs opens n loopback TCP connections and returns the server
// ends' descriptors (non-blocking, as Go leaves them) and the client ends.
func loopbackPairs(b *testing.B, n int) (fds []int, clients []net.Conn) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	var servers []net.Conn
	b.Cleanup(func() {
		for _, c := range append(servers, clients...) {
			_ = c.Close()
		}
	})
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		clients, servers = append(clients, c), append(servers, s)
		rc, _ := s.(*net.TCPConn).SyscallConn()
		_ = rc.Control(func(fd uintptr) { fds = append(fds, int(fd)) }) // #nosec G115 -- a descriptor
	}
	return fds, clients
}

// BenchmarkLoopbackWrite is the cost of one small write(2) to a loopback
// TCP socket on this machine, the unit of a fan-out: each op writes a
// 300-byte frame (an SSE message event's size) to the next of 5,000
// sockets, round robin. "idle readers": nobody reads, so no reader is
// woken (the receive buffers take the bytes); "epoll reader": one
// goroutine reads every socket as it becomes readable, as the fanout
// followers do, on the same cores. Reported: ns per write (wall) and the
// process's CPU µs per write (the writer's, plus the reader's when there
// is one).
//
//	cd bench/peers && go test -run '^$' -bench LoopbackWrite -benchtime 100000x
func BenchmarkLoopbackWrite(b *testing.B) {
	const n = 5000
	frame := make([]byte, 300)
	for _, reader := range []bool{false, true} {
		name := "idle readers"
		if reader {
			name = "epoll reader"
		}
		b.Run(name, func(b *testing.B) {
			fds, clients := loopbackPairs(b, n)
			var got, want atomic.Int64         // bytes read; bytes written (set once written)
			caughtUp := make(chan struct{}, 1) // the reader has read all that was written
			if reader {
				ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = syscall.Close(ep) }()
				for i, c := range clients {
					rc, _ := c.(*net.TCPConn).SyscallConn()
					_ = rc.Control(func(fd uintptr) {
						ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd), Pad: int32(i)} // #nosec G115
						_ = syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, int(fd), &ev)
					})
				}
				go func() {
					events := make([]syscall.EpollEvent, 512)
					buf := make([]byte, 256<<10)
					for {
						k, err := syscall.EpollWait(ep, events, 100)
						if err != nil && err != syscall.EINTR {
							return
						}
						for _, ev := range events[:max(k, 0)] {
							if m, _ := syscall.Read(int(ev.Fd), buf); m > 0 {
								got.Add(int64(m))
							}
						}
						if w := want.Load(); w > 0 && got.Load() >= w {
							select {
							case caughtUp <- struct{}{}:
							default:
							}
						}
					}
				}()
			}
			var r0, r1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
			b.ResetTimer()
			for i := range b.N {
				if _, err := syscall.Write(fds[i%n], frame); err != nil {
					b.Fatalf("write %d: %v", i, err)
				}
			}
			b.StopTimer()
			if reader {
				// The reader catches up (its CPU counts): every byte written read.
				want.Store(int64(b.N * len(frame)))
				select {
				case <-caughtUp:
				case <-time.After(30 * time.Second):
					b.Fatalf("the reader read %d of %d bytes", got.Load(), want.Load())
				}
			}
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
			cpu := time.Duration(syscall.TimevalToNsec(r1.Utime) - syscall.TimevalToNsec(r0.Utime) +
				syscall.TimevalToNsec(r1.Stime) - syscall.TimevalToNsec(r0.Stime))
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/write")
		})
	}
}

// TestFloorFrame_IsTheSizeOfHeraldsFollowEvent: the floor's frame carries
// the payload where the followers read its stamp, with an id: line, in a
// message JSON of Herald's keys, so that it costs the kernel and the
// followers what Herald's follow event does (~550 bytes for a 100-byte
// payload; the payload alone made a 123-byte frame).
func TestFloorFrame_IsTheSizeOfHeraldsFollowEvent(t *testing.T) {
	p := makePayload(7)
	f := heraldSizedFrame("peers-fanout-1", 7, p)
	if n := len(f); n < 520 || n > 600 {
		t.Fatalf("the frame is %d bytes, want Herald's follow event's size (520-600):\n%s", n, f)
	}
	lines := strings.Split(string(f), "\n")
	if len(lines) != 5 || lines[0] != "event: message" || !strings.HasPrefix(lines[1], "id: f1") ||
		!strings.HasPrefix(lines[2], "data: {") || lines[3] != "" || lines[4] != "" {
		t.Fatalf("not one SSE event with an id: and one data: line:\n%q", f)
	}
	var msg struct {
		Data    benchstat.Stamp `json:"data"`
		EventID string          `json:"eventId"`
		Offset  int             `json:"offset"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[2], "data: ")), &msg); err != nil {
		t.Fatalf("the data line is not JSON: %v", err)
	}
	if msg.Data.I != 7 || msg.Offset != 7 || "id: "+msg.EventID != lines[1] {
		t.Fatalf("the message JSON does not carry the payload and its id: %+v", msg)
	}
}
