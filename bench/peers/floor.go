package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// floorSys is the fanout scenario's floor on this machine: the least any
// server can do to broadcast one message to N SSE clients. A child process
// holds the streams (the response head and ": connected", then nothing
// but the messages) and, for each push, writes the one frame ("event:
// message", "data: " and the payload) to every socket, one write(2) each,
// the sockets split over GOMAXPROCS goroutines as Herald's hub splits
// them. No storage, no JSON, no id, no per-stream buffer or lock: what is
// left is the kernel's cost of a loopback TCP send per follower and the
// followers' cost to read it, on the same cores. A server's figures
// cannot go below it; the distance to it is what the server adds.
type floorSys struct{ childSys }

func startFloor(ctx context.Context, self string) (*floorSys, error) {
	cs, err := startChildSys(ctx, self, "floor")
	if err != nil {
		return nil, err
	}
	return &floorSys{cs}, nil
}

func (s *floorSys) name() string { return "floor" }

func (s *floorSys) run(context.Context, int, time.Duration, time.Duration) (sample, error) {
	return sample{}, errors.New("the floor is measured in the fanout scenario only")
}

func (s *floorSys) fanout(int) fanoutTarget {
	s.n++
	stream := fmt.Sprintf("peers-fanout-%d", s.n)
	return fanoutTarget{url: "http://" + s.ch.addr, path: "/follow/" + stream, ready: ": connected", cpu: s.cpu,
		push: func(ctx context.Context, _ int, p []byte) error {
			return s.post(ctx, "/push/"+stream, "pushing", p)
		}}
}

// floorConn is one stream of the floor server: its socket's descriptor,
// written directly.
type floorConn struct {
	conn net.Conn
	fd   int
}

// floorStream is one stream's followers; mu is held by a push's writes
// (the pushes' order is the frames' order) and by a follower's removal,
// so that no descriptor is closed under a write.
type floorStream struct {
	mu    sync.Mutex
	conns map[*floorConn]struct{}
}

// childFloor runs the floor server: GET /follow/{stream} (an SSE stream)
// and POST /push/{stream} (its body is the payload; answered once every
// socket was written).
func childFloor() error {
	var mu sync.Mutex
	streams := map[string]*floorStream{}
	streamOf := func(name string) *floorStream {
		mu.Lock()
		defer mu.Unlock()
		s := streams[name]
		if s == nil {
			s = &floorStream{conns: map[*floorConn]struct{}{}}
			streams[name] = s
		}
		return s
	}
	var blocked atomic.Int64 // writes the socket did not take at once: finished blocking
	mux := http.NewServeMux()
	mux.HandleFunc("GET /follow/{stream}", func(w http.ResponseWriter, r *http.Request) {
		s := streamOf(r.PathValue("stream"))
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"+
			"Cache-Control: no-cache\r\nConnection: close\r\n\r\n: connected\n\n"); err != nil {
			_ = conn.Close()
			return
		}
		sc, ok := conn.(syscall.Conn)
		if !ok {
			_ = conn.Close()
			return
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			_ = conn.Close()
			return
		}
		c := &floorConn{conn: conn}
		_ = rc.Control(func(fd uintptr) { c.fd = int(fd) }) // #nosec G115 -- a descriptor
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go func() { // until the client leaves, as any SSE server
			var b [1]byte
			for {
				if _, err := conn.Read(b[:]); err != nil {
					break
				}
			}
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = conn.Close()
		}()
	})
	mux.HandleFunc("POST /push/{stream}", func(w http.ResponseWriter, r *http.Request) {
		p, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		frame := append(append([]byte("event: message\ndata: "), p...), "\n\n"...)
		s := streamOf(r.PathValue("stream"))
		s.mu.Lock()
		all := make([]*floorConn, 0, len(s.conns))
		for c := range s.conns {
			all = append(all, c)
		}
		k := min(runtime.GOMAXPROCS(0), max(len(all)/512, 1))
		per := (len(all) + k - 1) / k
		var wg sync.WaitGroup
		for i := 0; i < len(all); i += per {
			part := all[i:min(i+per, len(all))]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, c := range part {
					n, err := syscall.Write(c.fd, frame)
					if n == len(frame) {
						continue
					}
					if err != nil && !errors.Is(err, syscall.EAGAIN) {
						continue // gone: its reader removes it
					}
					blocked.Add(1)
					_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
					_, _ = c.conn.Write(frame[max(n, 0):])
				}
			}()
		}
		wg.Wait()
		s.mu.Unlock()
		_, _ = io.WriteString(w, "{}")
	})
	if _, err := serveChild(mux); err != nil {
		return err
	}
	if n := blocked.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "floor: %d writes had to wait for their socket\n", n)
	}
	return nil
}
