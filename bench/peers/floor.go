package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
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
// but the messages) and, for each push, writes the one frame to every
// socket, one write(2) each, the sockets split over GOMAXPROCS goroutines
// as Herald's hub splits them. No storage, no JSON encoding, no
// per-stream buffer or lock: what is left is the kernel's cost of a
// loopback TCP send per follower and the followers' cost to read it, on
// the same cores. A server's figures cannot go below it; the distance to
// it is what the server adds.
//
// The floor is held to what Herald is measured on (floor-sync, the first
// floor, is kept for comparison): its frame is the size of Herald's
// (event: message, an id: line, the payload inside a message JSON of
// Herald's keys and lengths: ~550 bytes for a 100-byte payload, against
// ~120 for the payload alone), and a push is answered as soon as its
// frame is queued, as Herald answers once the message is stored: the
// writes run behind the answer, one fan-out at a time per stream, a
// backlog's frames written together (Herald's hub joins them too). A
// floor that answers only once every socket is written holds the next
// push back while it writes: the benchmark's pusher, one push at a time,
// then starts it late and stamps it late, so that the wait behind the
// previous fan-out, which Herald's followers see, is not counted.
type floorSys struct {
	childSys
	sync bool // floor-sync: a small frame, the push answered once every socket is written
}

// startFloor starts the floor; sync, the first floor (floor-sync).
func startFloor(ctx context.Context, self string, sync bool) (*floorSys, error) {
	args := []string{"floor"}
	if sync {
		args = append(args, "sync")
	}
	cs, err := startChildSys(ctx, self, args...)
	if err != nil {
		return nil, err
	}
	return &floorSys{childSys: cs, sync: sync}, nil
}

func (s *floorSys) name() string {
	if s.sync {
		return "floor-sync"
	}
	return "floor"
}

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

// floorStream is one stream's followers; mu is held by a fan-out's writes
// (the frames' order is the pushes') and by a follower's removal, so that
// no descriptor is closed under a write.
type floorStream struct {
	mu    sync.Mutex
	conns map[*floorConn]struct{}

	qmu     sync.Mutex
	pending [][]byte // frames pushed, not yet being written
	writing bool     // a fan-out goroutine runs
	seq     int
}

// floorBlocked counts writes the socket did not take at once.
var floorBlocked atomic.Int64

// writeAll writes buf to every socket, one write(2) each, the sockets
// split over GOMAXPROCS goroutines. Called with mu.
func (s *floorStream) writeAll(buf []byte) {
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
				n, err := syscall.Write(c.fd, buf)
				if n == len(buf) {
					continue
				}
				if err != nil && !errors.Is(err, syscall.EAGAIN) {
					continue // gone: its reader removes it
				}
				floorBlocked.Add(1)
				_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
				_, _ = c.conn.Write(buf[max(n, 0):])
			}
		}()
	}
	wg.Wait()
}

// queue takes a pushed payload as the stream's next frame; the stream's
// fan-out goroutine writes it.
func (s *floorStream) queue(name string, p []byte) {
	s.qmu.Lock()
	s.seq++
	s.pending = append(s.pending, heraldSizedFrame(name, s.seq, p))
	start := !s.writing
	s.writing = true
	s.qmu.Unlock()
	if start {
		go s.fanOut()
	}
}

// fanOut writes what was pushed, a backlog's frames in one buffer, until
// nothing waits.
func (s *floorStream) fanOut() {
	for {
		s.qmu.Lock()
		if len(s.pending) == 0 {
			s.writing = false
			s.qmu.Unlock()
			return
		}
		buf := bytes.Join(s.pending, nil)
		s.pending = nil
		s.qmu.Unlock()
		s.mu.Lock()
		s.writeAll(buf)
		s.mu.Unlock()
	}
}

// floorUUID stands for the UUIDs of Herald's message JSON.
const floorUUID = "0195b7a4-1c2d-7e3f-8a9b-0c1d2e3f4a5b"

// heraldSizedFrame is payload p as an SSE event the size of Herald's
// follow event: an id: line of an event id's length and p inside a
// message JSON with Herald's keys and value lengths (followMessageJSON).
func heraldSizedFrame(stream string, seq int, p []byte) []byte {
	raw := make([]byte, 25)                           // an event id: queue tag, xid, partition id, offset
	binary.BigEndian.PutUint64(raw[17:], uint64(seq)) // #nosec G115 -- a counter
	id := "f1" + base64.RawURLEncoding.EncodeToString(raw)
	created := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
	return fmt.Appendf(nil, "event: message\nid: %s\ndata: {\"consumerGroup\":\"\",\"createdAt\":%q,\"data\":%s,"+
		"\"id\":%q,\"leaseId\":\"\",\"partition\":\"Default\",\"partitionId\":%q,\"producerSub\":null,\"queue\":%q,"+
		"\"retryCount\":0,\"traceId\":null,\"transactionId\":%q,\"offset\":%d,\"eventId\":%q}\n\n",
		id, created, p, floorUUID, floorUUID, stream, floorUUID, seq, id)
}

// childFloor runs the floor server: GET /follow/{stream} (an SSE stream)
// and POST /push/{stream} (its body is the payload; answered once its
// frame is queued; with "sync", once every socket was written, the frame
// the payload alone).
func childFloor(args []string) error {
	syncPush := len(args) > 0 && args[0] == "sync"
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
		s := streamOf(r.PathValue("stream"))
		if syncPush {
			s.mu.Lock()
			s.writeAll(append(append([]byte("event: message\ndata: "), p...), "\n\n"...))
			s.mu.Unlock()
		} else {
			s.queue(r.PathValue("stream"), p)
		}
		_, _ = io.WriteString(w, "{}")
	})
	if _, err := serveChild(mux); err != nil {
		return err
	}
	if n := floorBlocked.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "floor: %d writes had to wait for their socket\n", n)
	}
	return nil
}
