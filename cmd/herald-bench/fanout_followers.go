package main

// The fanout followers: raw SSE clients held by child processes of the
// benchmark (one process cannot hold 10,000 sockets and the server's under
// a 20,000 open-file limit, and a child's CPU is not the server's). This
// file is the same in cmd/herald-bench and bench/peers (two modules): keep
// them equal.

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
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// fanoutBucket is the latency histogram's resolution; fanoutBuckets of
// them cover 30 s (a later receipt lands in the last).
const (
	fanoutBucket  = 100 * time.Microsecond
	fanoutBuckets = 300000
)

// fanoutCounts is what followers received: every follower must get every
// message, in push order (the payload's "i" counts pushes from 0).
type fanoutCounts struct {
	Followers  int      `json:"followers"`
	Expected   int64    `json:"expected"`   // followers × messages pushed
	Received   int64    `json:"received"`   // messages received in order
	Violations int64    `json:"violations"` // messages received out of order or twice
	Losses     int64    `json:"losses"`     // messages expected and never received
	Ended      int      `json:"ended"`      // streams the server ended before the last message
	Hist       [][2]int `json:"hist"`       // latency bucket (fanoutBucket) → receipts, after warm-up
}

func (c *fanoutCounts) add(o fanoutCounts) {
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
func (c *fanoutCounts) quantile(p float64) float64 {
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

// runFollowers is the child: it opens --n SSE streams to --urls (round
// robin) + --path, from --local loopback source addresses, says "ready"
// once each has seen a line starting with --ready, then answers every
// "end TOTAL" line on stdin with a "result {fanoutCounts}" line once each
// follower has TOTAL messages (or 15 s passed); it exits when stdin closes.
func runFollowers(args []string) int {
	fs := flag.NewFlagSet("followers", flag.ContinueOnError)
	urls := fs.String("urls", "", "comma-separated http://host:port")
	path := fs.String("path", "", "request path and query")
	n := fs.Int("n", 0, "followers")
	warm := fs.Int("warm", 0, "messages below this index are warm-up: not in the latencies")
	ready := fs.String("ready", "", "a line starting with this says the stream follows")
	local := fs.Int("local", 8, "loopback source addresses 127.0.0.2… to spread the ephemeral ports over")
	if fs.Parse(args) != nil || *n <= 0 || *urls == "" {
		return 2
	}
	targets := strings.Split(*urls, ",")
	hist := make([]atomic.Int64, fanoutBuckets)
	fol := make([]fanoutFollower, *n)
	var opened sync.WaitGroup
	opened.Add(*n)
	var failed atomic.Value
	sem := make(chan struct{}, 64)
	for k := range *n {
		fol[k].last.Store(-1)
		sem <- struct{}{}
		go func() {
			once := sync.OnceFunc(opened.Done)
			defer once()
			err := followOne(targets[k%len(targets)], *path, *ready, *warm, *local, k, &fol[k], hist, func() {
				<-sem
				once()
			})
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
		c := fanoutCounts{Followers: *n, Expected: total * int64(*n)}
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

// followOne reads one SSE stream until it ends; opened is called once it
// follows (or failed).
func followOne(target, path, ready string, warm, local, k int, f *fanoutFollower, hist []atomic.Int64, opened func()) error {
	u, err := url.Parse(target)
	if err != nil {
		opened()
		return fmt.Errorf("parsing %s: %w", target, err)
	}
	d := net.Dialer{Timeout: 30 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+k%local))}}
	conn, err := d.Dial("tcp", u.Host)
	if err != nil {
		opened()
		return fmt.Errorf("connecting to %s: %w", u.Host, err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", path, u.Host); err != nil {
		opened()
		return fmt.Errorf("requesting: %w", err)
	}
	br := bufio.NewReaderSize(conn, 2048)
	res, err := http.ReadResponse(br, nil) //nolint:bodyclose // the body is the connection's, closed by the defer above
	if err != nil {
		opened()
		return fmt.Errorf("reading the response: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		opened()
		return fmt.Errorf("GET %s: %s", path, res.Status)
	}
	body := br
	if len(res.TransferEncoding) > 0 { // chunked (net/http's writer)
		body = bufio.NewReaderSize(res.Body, 2048)
	}
	following := false
	for {
		line, err := body.ReadSlice('\n')
		if err != nil {
			if !following {
				opened()
				return fmt.Errorf("the stream ended before it followed: %w", err)
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				f.ended.Store(true)
				return nil
			}
		}
		if !following {
			if bytes.HasPrefix(line, []byte(ready)) {
				following = true
				opened()
			}
			continue
		}
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		now := time.Now().UnixNano()
		t, ok1 := intAfter(line, `"t":`)
		i, ok2 := intAfter(line, `"i":`)
		if !ok1 || !ok2 {
			continue // a ping, a connect reply
		}
		last := f.last.Load()
		if i <= last {
			f.violations.Add(1)
			continue
		}
		f.received.Add(1)
		f.last.Store(i)
		if i >= int64(warm) {
			b := min(max((now-t)/int64(fanoutBucket), 0), fanoutBuckets-1)
			hist[b].Add(1)
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

// followerProcs are the running children of one measurement.
type followerProcs struct {
	procs []*followerProc
}

type followerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startFollowers starts procs children (the command is argv, this binary
// and its child subcommand) holding n followers between them, and returns
// once every one follows.
func startFollowers(ctx context.Context, argv []string, procs, n int, urls []string, path, ready string, warm int,
	log io.Writer) (*followerProcs, error) {
	fp := &followerProcs{}
	errc := make(chan error, procs)
	for p := range procs {
		share := n / procs
		if p < n%procs {
			share++
		}
		args := append(append([]string(nil), argv[1:]...), "--urls", strings.Join(urls, ","), "--path", path,
			"--n", strconv.Itoa(share), "--ready", ready, "--warm", strconv.Itoa(warm))
		cmd := exec.CommandContext(ctx, argv[0], args...) // #nosec G204 -- our own binary
		cmd.Stderr = log
		in, err := cmd.StdinPipe()
		if err != nil {
			fp.close()
			return nil, fmt.Errorf("piping to a follower process: %w", err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			fp.close()
			return nil, fmt.Errorf("piping from a follower process: %w", err)
		}
		if err := cmd.Start(); err != nil {
			fp.close()
			return nil, fmt.Errorf("starting a follower process: %w", err)
		}
		pr := &followerProc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		pr.out.Buffer(make([]byte, 1<<20), 64<<20)
		fp.procs = append(fp.procs, pr)
		go func() {
			if !pr.out.Scan() {
				errc <- errors.New("a follower process ended before it was ready")
				return
			}
			if l := pr.out.Text(); l != "ready" {
				errc <- fmt.Errorf("follower process: %s", l)
				return
			}
			errc <- nil
		}()
	}
	for range procs {
		if err := <-errc; err != nil {
			fp.close()
			return nil, err
		}
	}
	return fp, nil
}

// finish tells the children that total messages were pushed and sums what
// their followers received.
func (fp *followerProcs) finish(total int) (fanoutCounts, error) {
	var sum fanoutCounts
	for _, p := range fp.procs {
		if _, err := fmt.Fprintf(p.in, "end %d\n", total); err != nil {
			return sum, fmt.Errorf("telling a follower process: %w", err)
		}
	}
	for _, p := range fp.procs {
		if !p.out.Scan() {
			return sum, errors.New("a follower process ended without its result")
		}
		var c fanoutCounts
		l, ok := strings.CutPrefix(p.out.Text(), "result ")
		if !ok || json.Unmarshal([]byte(l), &c) != nil {
			return sum, fmt.Errorf("follower process: %s", p.out.Text())
		}
		sum.add(c)
	}
	return sum, nil
}

// cpu is the children's user+system CPU time so far (the load
// generator's side of the deliveries).
func (fp *followerProcs) cpu() time.Duration {
	var d time.Duration
	for _, p := range fp.procs {
		if f := procStat(p.cmd.Process.Pid); len(f) >= 13 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			d += time.Duration(ut+st) * time.Second / 100 // USER_HZ
		}
	}
	return d
}

// close ends the children (they close their streams).
func (fp *followerProcs) close() {
	for _, p := range fp.procs {
		_ = p.in.Close()
	}
	for _, p := range fp.procs {
		_ = p.cmd.Wait()
	}
}

// paceSequential calls push for i = 0…total-1 at rate per second, one at a
// time (the next starts when the previous is done, or at its time if
// later): the pushes' order is their index's, which the followers check.
func paceSequential(ctx context.Context, rate, total int, push func(ctx context.Context, i int) error) (int, error) {
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

// loadAverage is the 1, 5 and 15 minute load of the machine.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
