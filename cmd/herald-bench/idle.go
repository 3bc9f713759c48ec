package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/heraldmq/herald/internal/fanoutload"
)

// holderCmd is the hidden subcommand of a connection-holding child.
const holderCmd = "__hold"

// idleQueues spreads idle subscribers over this many queues.
const idleQueues = 100

// idleResult is the cost of connections that wait for messages.
type idleResult struct {
	WS             int     `json:"ws"`
	SSE            int     `json:"sse"`
	LongPoll       int     `json:"longpoll"`
	ConnectPerSec  float64 `json:"connect_per_s"`
	RSSBefore      int64   `json:"rss_before_bytes"`
	RSSAfter       int64   `json:"rss_after_bytes"`   // 2 s after the last connect
	RSSSettled     int64   `json:"rss_settled_bytes"` // at the end of the idle window
	BytesPerConn   float64 `json:"bytes_per_conn"`
	CPUPercent     float64 `json:"idle_cpu_percent"`
	QueriesPerSec  float64 `json:"db_queries_per_s"`
	MeasuredFor    float64 `json:"measured_s"`
	FileLimitNote  string  `json:"note,omitempty"`
	ServerMeasured bool    `json:"server_measured"`
}

// openFileLimit reads the soft open-file limit of a process.
func openFileLimit(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(line)
			n, _ := strconv.Atoi(f[3])
			return n
		}
	}
	return 0
}

// metricConns is the room the benchmark keeps below the server's
// connection cap for its own reads of /metrics.
const metricConns = 8

// serverCap is how many connections the benchmark may hold on srv: the
// server's own cap (herald_connections_max: the open-file limit lim less
// its reserve for the database and files) less room for the benchmark's
// metric reads; lim less 300 when the server does not say.
func serverCap(srv *server, lim int) int {
	if m, err := srv.metric("herald_connections_max"); err == nil && m > 0 {
		return int(m) - metricConns
	}
	return lim - 300
}

func runIdle(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) (*idleResult, error) {
	res := &idleResult{WS: cfg.IdleWS, SSE: cfg.IdleSSE, LongPoll: cfg.IdleLP, ServerMeasured: srv.pid != 0}
	if lim := openFileLimit(srv.pid); lim > 0 {
		// The server's own cap (herald_connections_max: the open-file
		// limit less its reserve for the database and files), less room
		// for this benchmark's metric reads: a connection past it is
		// refused, and a long-poll refused waits a second to ask again.
		capped := serverCap(srv, lim)
		if total := res.WS + res.SSE + res.LongPoll; total > capped {
			scale := float64(capped) / float64(total)
			res.WS, res.SSE = int(float64(res.WS)*scale), int(float64(res.SSE)*scale)
			res.LongPoll = int(float64(res.LongPoll) * scale)
			res.FileLimitNote = fmt.Sprintf("the server's open-file limit (%d) caps the connections at %d WS + %d SSE + %d long-poll",
				lim, res.WS, res.SSE, res.LongPoll)
			progress(log, "idle: %s", res.FileLimitNote)
		}
	}
	time.Sleep(time.Second) // let the server settle after start-up
	res.RSSBefore = srv.rss()
	progress(log, "idle: opening %d WebSocket, %d SSE and %d long-poll connections from %d processes", res.WS, res.SSE,
		res.LongPoll, cfg.Holders)
	start := time.Now()
	release, err := hold(ctx, srv, res.WS, res.SSE, res.LongPoll, cfg.Holders, log)
	defer release()
	if err != nil {
		return nil, err
	}
	// Every connection waits as an intention: WebSocket subscriptions,
	// SSE streams and long-polls.
	want := float64(res.WS + res.SSE + res.LongPoll)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if n, _ := srv.metric("herald_intentions"); n >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.ConnectPerSec = float64(res.WS+res.SSE+res.LongPoll) / time.Since(start).Seconds()
	wsN, _ := srv.metric("herald_ws_connections")
	sseN, _ := srv.metric("herald_sse_streams")
	waiting, _ := srv.metric("herald_intentions")
	progress(log, "idle: server reports %.0f WebSocket and %.0f SSE connections, %.0f waiting (%.0f connects/s)", wsN, sseN,
		waiting, res.ConnectPerSec)
	if int(wsN) != res.WS || int(sseN) != res.SSE || waiting < want {
		return nil, fmt.Errorf("server holds %.0f WS and %.0f SSE connections and %.0f waiting, want %d, %d and %.0f",
			wsN, sseN, waiting, res.WS, res.SSE, want)
	}
	time.Sleep(2 * time.Second) // let the first sweep and GC pass
	res.RSSAfter = srv.rss()
	cpu0 := srv.cpu()
	q0, _ := srv.metric("herald_db_queries_total")
	t0 := time.Now()
	select {
	case <-time.After(cfg.IdleFor):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	el := time.Since(t0)
	q1, _ := srv.metric("herald_db_queries_total")
	res.MeasuredFor = el.Seconds()
	res.CPUPercent = 100 * (srv.cpu() - cpu0).Seconds() / el.Seconds()
	// Steady state: the garbage of the connects (request buffers, headers)
	// has been collected and returned by then.
	res.RSSSettled = srv.rss()
	res.BytesPerConn = float64(res.RSSSettled-res.RSSBefore) / float64(res.WS+res.SSE+res.LongPoll)
	res.QueriesPerSec = (q1 - q0) / el.Seconds()
	progress(log, "idle: %.0f bytes of RSS per connection, %.2f%% CPU, %.2f queries/s", res.BytesPerConn, res.CPUPercent, res.QueriesPerSec)
	return res, nil
}

// hold opens ws + sse + lp idle connections from n child processes and
// returns once they are open; release closes them.
func hold(ctx context.Context, srv *server, ws, sse, lp, n int, log io.Writer) (release func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return func() {}, err
	}
	args := make([][]string, n)
	for i := range n {
		w, s, l := ws/n, sse/n, lp/n
		if i == 0 {
			w, s, l = w+ws%n, s+sse%n, l+lp%n
		}
		args[i] = []string{"--url", srv.url, "--ws", strconv.Itoa(w), "--sse", strconv.Itoa(s), "--lp", strconv.Itoa(l)}
	}
	holders, err := fanoutload.StartChildren(ctx, []string{exe, holderCmd}, args, log)
	if err != nil {
		return func() {}, err
	}
	return holders.Close, nil
}

// runHolder opens idle connections, says "ready" on stdout and holds them
// until stdin closes.
func runHolder(args []string) int {
	fs := flag.NewFlagSet(holderCmd, flag.ContinueOnError)
	url := fs.String("url", "", "")
	nws := fs.Int("ws", 0, "")
	nsse := fs.Int("sse", 0, "")
	nlp := fs.Int("lp", 0, "")
	if fs.Parse(args) != nil {
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(*url, "http") + "/api/v1/ws"
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 1, DisableCompression: true}
	hc := &http.Client{Transport: tr}
	var opened atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // connects in flight
	fail := make(chan error, 1)
	failed := func(err error) { // the first failure is reported
		select {
		case fail <- err:
		default:
		}
	}
	for i := range *nws + *nsse {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			q := fmt.Sprintf("bench-idle-%d", i%idleQueues)
			if i < *nws {
				d := websocket.Dialer{Subprotocols: []string{"herald.v1"}, ReadBufferSize: 512, WriteBufferSize: 512}
				ws, res, err := d.DialContext(ctx, wsURL, nil)
				if err != nil {
					failed(err)
					return
				}
				_ = res.Body.Close()
				if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","queue":"`+q+`"}`)); err != nil {
					return
				}
				_, _, _ = ws.ReadMessage() // subscribed
				opened.Add(1)
				go func() {
					defer func() { _ = ws.Close() }()
					for {
						if _, _, err := ws.ReadMessage(); err != nil {
							return
						}
					}
				}()
				return
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, *url+"/api/v1/sse/queue/"+q, nil)
			res, err := hc.Do(req) //nolint:bodyclose // held open on purpose; closed by the reading goroutine
			if err != nil {
				failed(err)
				return
			}
			br := bufio.NewReader(res.Body)
			if _, err := br.ReadString('\n'); err != nil { // the retry: line: the stream is open
				return
			}
			opened.Add(1)
			go func() {
				defer func() { _ = res.Body.Close() }()
				_, _ = io.Copy(io.Discard, br)
			}()
		})
	}
	wg.Wait()
	// Long-polls: each waits up to 30 s and asks again at once.
	for i := range *nlp {
		q := fmt.Sprintf("bench-idle-%d", i%idleQueues)
		go func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, *url+"/api/v1/pop/queue/"+q+"?wait=true&timeout=30000", nil)
				res, err := hc.Do(req)
				if err != nil {
					time.Sleep(time.Second)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
			}
		}()
	}
	select {
	case err := <-fail:
		fmt.Printf("error: %v (%d opened)\n", err, opened.Load())
		return 1
	default:
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // hold until the parent closes stdin
	return 0
}
