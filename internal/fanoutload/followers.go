package fanoutload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// fanoutBucket is the latency histogram's resolution; fanoutBuckets of
// them cover 30 s (a later receipt lands in the last).
const (
	fanoutBucket  = 100 * time.Microsecond
	fanoutBuckets = 300000
)

// Counts is what followers received: every follower must get every
// message, in push order (the payload's "i" counts pushes from 0).
type Counts struct {
	Followers  int      `json:"followers"`
	Expected   int64    `json:"expected"`   // followers × messages pushed
	Received   int64    `json:"received"`   // messages received in order
	Violations int64    `json:"violations"` // messages received out of order or twice
	Losses     int64    `json:"losses"`     // messages expected and never received
	Ended      int      `json:"ended"`      // streams the server ended before the last message
	Hist       [][2]int `json:"hist"`       // latency bucket (fanoutBucket) → receipts, after warm-up
}

func (c *Counts) Add(o Counts) {
	c.Followers += o.Followers
	c.Expected += o.Expected
	c.Received += o.Received
	c.Violations += o.Violations
	c.Losses += o.Losses
	c.Ended += o.Ended
	c.Hist = append(c.Hist, o.Hist...)
}

// quantile is the p-th percentile (0-100) of the latencies, in ms; max is
// p = 100.
func (c *Counts) Quantile(p float64) float64 {
	h := make([]int, fanoutBuckets)
	n := 0
	for _, b := range c.Hist {
		h[b[0]] += b[1]
		n += b[1]
	}
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = max(rank, 1)
	seen := 0
	for i, v := range h {
		if seen += v; seen >= rank {
			return float64(time.Duration(i+1)*fanoutBucket) / float64(time.Millisecond)
		}
	}
	return 0
}

// fanoutFollower is one SSE follower's view, read by the reporter.
type fanoutFollower struct {
	last       atomic.Int64 // the last message index received in order; -1 before
	received   atomic.Int64
	violations atomic.Int64
	ended      atomic.Bool
}

// RunFollowers is the child: it opens --n SSE streams to --urls (round
// robin) + --path, from --local loopback source addresses, says "ready"
// once each has seen a line starting with --ready, then answers every
// "end TOTAL" line on stdin with a "result {Counts}" line once each
// follower has TOTAL messages (or 15 s passed); it exits when stdin closes.
//
// The load generator shares the cores with the server it measures, so it
// is kept cheap: each stream is a raw non-blocking socket, and --loops
// epoll loops (one goroutine each, no goroutine per stream) read every
// ready socket into one large buffer and parse only what the measure
// needs (the data lines' "t" and "i"), de-chunking in place when the
// server sends chunked bodies (centrifuge's net/http).
func RunFollowers(args []string) int {
	fs := flag.NewFlagSet("followers", flag.ContinueOnError)
	urls := fs.String("urls", "", "comma-separated http://host:port")
	path := fs.String("path", "", "request path and query")
	n := fs.Int("n", 0, "followers")
	warm := fs.Int("warm", 0, "messages below this index are warm-up: not in the latencies")
	ready := fs.String("ready", "", "a line starting with this says the stream follows")
	local := fs.Int("local", 8, "loopback source addresses 127.0.0.2… to spread the ephemeral ports over")
	loops := fs.Int("loops", runtime.GOMAXPROCS(0), "epoll loops reading the streams")
	if fs.Parse(args) != nil || *n <= 0 || *urls == "" || *loops < 1 {
		return 2
	}
	targets := strings.Split(*urls, ",")
	hist := make([]atomic.Int64, fanoutBuckets)
	fol := make([]fanoutFollower, *n)
	rd, err := newSSEReaders(*loops, *n)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		return 1
	}
	var opened sync.WaitGroup
	var failed atomic.Value
	sem := make(chan struct{}, 64)
	for k := range *n {
		fol[k].last.Store(-1)
		sem <- struct{}{}
		opened.Add(1)
		go func() {
			defer opened.Done()
			defer func() { <-sem }()
			c, err := dialSSE(targets[k%len(targets)], *path, *ready, *local, k, &fol[k], hist, *warm)
			if err == nil {
				err = rd.add(k, c)
			}
			if err != nil && failed.Load() == nil {
				failed.Store(err)
			}
		}()
	}
	opened.Wait()
	if err, _ := failed.Load().(error); err != nil {
		fmt.Printf("error: %v\n", err)
		return 1
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 2 || f[0] != "end" {
			continue
		}
		total, _ := strconv.ParseInt(f[1], 10, 64)
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			all := true
			for k := range fol {
				if fol[k].last.Load() < total-1 && !fol[k].ended.Load() {
					all = false
					break
				}
			}
			if all {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		c := Counts{Followers: *n, Expected: total * int64(*n)}
		for k := range fol {
			c.Received += fol[k].received.Load()
			c.Violations += fol[k].violations.Load()
			if fol[k].ended.Load() {
				c.Ended++
			}
		}
		c.Losses = c.Expected - c.Received
		for i := range hist {
			if v := hist[i].Swap(0); v > 0 {
				c.Hist = append(c.Hist, [2]int{i, int(v)})
			}
		}
		b, _ := json.Marshal(c)
		fmt.Printf("result %s\n", b)
	}
	return 0
}

// sseConn is one follower's stream: a raw socket and what its parser
// carries from one read to the next.
type sseConn struct {
	fd        int
	f         *fanoutFollower
	hist      []atomic.Int64
	warm      int
	ready     []byte
	following bool // the ready line was seen
	chunked   bool
	// Chunk decoding: left is the bytes of the current chunk still to
	// come; at 0, a size line is read (size, sized once its digits end),
	// or, after a chunk's data (crlf), the line end that follows it.
	left  int
	size  int
	sized bool
	crlf  bool
	line  []byte // an incomplete line from the last read
}

var dataPrefix = []byte("data: ")

// feed takes bytes of the response body read at now (UnixNano).
func (c *sseConn) feed(p []byte, now int64) {
	if !c.chunked {
		c.lines(p, now)
		return
	}
	for len(p) > 0 {
		if c.left > 0 {
			k := min(c.left, len(p))
			c.lines(p[:k], now)
			c.left -= k
			p = p[k:]
			c.crlf = c.left == 0
			continue
		}
		i := bytes.IndexByte(p, '\n')
		end := i
		if i < 0 {
			end = len(p)
		}
		if !c.crlf { // a size line: hex digits, perhaps ;extensions, CRLF
			for _, b := range p[:end] {
				d := -1
				switch {
				case b >= '0' && b <= '9':
					d = int(b - '0')
				case b >= 'a' && b <= 'f':
					d = int(b-'a') + 10
				case b >= 'A' && b <= 'F':
					d = int(b-'A') + 10
				}
				if d < 0 {
					c.sized = true
				} else if !c.sized {
					c.size = c.size<<4 | d
				}
			}
		}
		if i < 0 {
			return
		}
		p = p[i+1:]
		if c.crlf {
			c.crlf = false
			continue
		}
		c.left, c.size, c.sized = c.size, 0, false
		if c.left == 0 { // the last chunk: the stream ends
			return
		}
	}
}

// lines runs handle on every complete line of p, the incomplete one
// before it first, and keeps the incomplete one at its end.
func (c *sseConn) lines(p []byte, now int64) {
	if len(c.line) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.line = append(c.line, p...)
			return
		}
		c.line = append(c.line, p[:i+1]...)
		c.handle(c.line, now)
		c.line = c.line[:0]
		p = p[i+1:]
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.line = append(c.line, p...)
			return
		}
		c.handle(p[:i+1], now)
		p = p[i+1:]
	}
}

// handle reads one line: the ready line, then the data lines' stamps.
func (c *sseConn) handle(line []byte, now int64) {
	if !c.following {
		c.following = bytes.HasPrefix(line, c.ready)
		return
	}
	if !bytes.HasPrefix(line, dataPrefix) {
		return
	}
	t, ok1 := intAfter(line, `"t":`)
	i, ok2 := intAfter(line, `"i":`)
	if !ok1 || !ok2 {
		return // a ping, a connect reply
	}
	f := c.f
	if i <= f.last.Load() {
		f.violations.Add(1)
		return
	}
	f.received.Add(1)
	f.last.Store(i)
	if i >= int64(c.warm) {
		b := min(max((now-t)/int64(fanoutBucket), 0), fanoutBuckets-1)
		c.hist[b].Add(1)
	}
}

// dialSSE opens follower k's stream with blocking system calls and reads
// it until its ready line; the socket is then made non-blocking for the
// readers.
func dialSSE(target, path, ready string, local, k int, f *fanoutFollower, hist []atomic.Int64, warm int) (*sseConn, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", target, err)
	}
	ap, err := netip.ParseAddrPort(u.Host)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("%s is not an IPv4 host:port", u.Host)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening a socket: %w", err)
	}
	c := &sseConn{fd: fd, f: f, hist: hist, warm: warm, ready: []byte(ready)}
	fail := func(err error) (*sseConn, error) {
		_ = syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, byte(2 + k%local)}}); err != nil {
		return fail(fmt.Errorf("binding: %w", err))
	}
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fail(fmt.Errorf("connecting to %s: %w", u.Host, err))
	}
	req := []byte(fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", path, u.Host))
	for len(req) > 0 {
		n, err := syscall.Write(fd, req)
		if err != nil {
			return fail(fmt.Errorf("requesting: %w", err))
		}
		req = req[n:]
	}
	buf := make([]byte, 4096)
	var head []byte // the response head, until it is read
	inBody := false
	for !c.following {
		n, err := syscall.Read(fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return fail(fmt.Errorf("the stream ended before it followed: %v", err))
		}
		if inBody {
			c.feed(buf[:n], time.Now().UnixNano())
			continue
		}
		head = append(head, buf[:n]...)
		end := bytes.Index(head, []byte("\r\n\r\n"))
		if end < 0 {
			continue
		}
		status, hdr, _ := bytes.Cut(head[:end], []byte("\r\n"))
		if f := bytes.Fields(status); len(f) < 2 || string(f[1]) != "200" {
			return fail(fmt.Errorf("GET %s: %s", path, status))
		}
		c.chunked = bytes.Contains(bytes.ToLower(hdr), []byte("transfer-encoding: chunked"))
		inBody = true
		c.feed(head[end+4:], time.Now().UnixNano())
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		return fail(fmt.Errorf("making the socket non-blocking: %w", err))
	}
	return c, nil
}

// sseReaders are the epoll loops reading every stream of a child.
type sseReaders struct {
	epfds []int
	mu    sync.Mutex
	conns []*sseConn // by follower index
}

func newSSEReaders(loops, n int) (*sseReaders, error) {
	r := &sseReaders{conns: make([]*sseConn, n)}
	for range loops {
		ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("creating an epoll: %w", err)
		}
		r.epfds = append(r.epfds, ep)
		go r.loop(ep)
	}
	return r, nil
}

// add hands follower k's stream to a loop.
func (r *sseReaders) add(k int, c *sseConn) error {
	r.mu.Lock()
	r.conns[k] = c
	r.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.fd), Pad: int32(k)} // #nosec G115 -- fds and indexes < 2^31
	if err := syscall.EpollCtl(r.epfds[k%len(r.epfds)], syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		_ = syscall.Close(c.fd)
		return fmt.Errorf("watching a stream: %w", err)
	}
	return nil
}

// loop reads the streams of epoll ep as they become readable (level
// triggered: one read each, the rest at the next wait).
func (r *sseReaders) loop(ep int) {
	events := make([]syscall.EpollEvent, 512)
	buf := make([]byte, 256<<10)
	for {
		n, err := syscall.EpollWait(ep, events, -1)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			fmt.Fprintf(os.Stderr, "followers: epoll_wait: %v\n", err)
			return
		}
		for _, ev := range events[:n] {
			r.mu.Lock()
			c := r.conns[ev.Pad]
			r.mu.Unlock()
			m, err := syscall.Read(c.fd, buf)
			if err == syscall.EAGAIN || err == syscall.EINTR {
				continue
			}
			if m > 0 {
				c.feed(buf[:m], time.Now().UnixNano())
				continue
			}
			c.f.ended.Store(true) // the server ended it (or it broke)
			_ = syscall.EpollCtl(ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
			_ = syscall.Close(c.fd)
		}
	}
}

// intAfter reads the integer after the first key in line.
func intAfter(line []byte, key string) (int64, bool) {
	at := bytes.Index(line, []byte(key))
	if at < 0 {
		return 0, false
	}
	var v int64
	j := at + len(key)
	start := j
	for ; j < len(line) && line[j] >= '0' && line[j] <= '9'; j++ {
		v = v*10 + int64(line[j]-'0')
	}
	return v, j > start
}

// StartFollowers starts procs children (the command is argv, this binary
// and its child subcommand) holding n followers between them, and returns
// once every one follows.
func StartFollowers(ctx context.Context, argv []string, procs, n int, urls []string, path, ready string, warm int,
	log io.Writer) (*Procs, error) {
	args := make([][]string, procs)
	for p := range procs {
		share := n / procs
		if p < n%procs {
			share++
		}
		args[p] = []string{"--urls", strings.Join(urls, ","), "--path", path,
			"--n", strconv.Itoa(share), "--ready", ready, "--warm", strconv.Itoa(warm)}
	}
	return StartChildren(ctx, argv, args, log)
}

// finish tells the children that total messages were pushed and sums what
// their followers received.
func (fp *Procs) Finish(total int) (Counts, error) {
	var sum Counts
	for _, p := range fp.procs {
		if _, err := fmt.Fprintf(p.in, "end %d\n", total); err != nil {
			return sum, fmt.Errorf("telling a follower process: %w", err)
		}
	}
	for _, p := range fp.procs {
		if !p.out.Scan() {
			return sum, errors.New("a follower process ended without its result")
		}
		var c Counts
		l, ok := strings.CutPrefix(p.out.Text(), "result ")
		if !ok || json.Unmarshal([]byte(l), &c) != nil {
			return sum, fmt.Errorf("follower process: %s", p.out.Text())
		}
		sum.Add(c)
	}
	return sum, nil
}

// PaceSequential calls push for i = 0…total-1 at rate per second, one at a
// time (the next starts when the previous is done, or at its time if
// later): the pushes' order is their index's, which the followers check.
func PaceSequential(ctx context.Context, rate, total int, push func(ctx context.Context, i int) error) (int, error) {
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return i, ctx.Err()
			}
		}
		if err := push(ctx, i); err != nil {
			return i, err
		}
	}
	return total, nil
}

// LoadAverage is the 1, 5 and 15 minute load of the machine.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// ProcStat returns the fields of /proc/pid/stat after the command name
// (which is in parentheses and may hold spaces); nil when it is gone.
func ProcStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}
