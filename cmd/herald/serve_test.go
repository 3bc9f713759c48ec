package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// buildHerald compiles the binary once per test.
func buildHerald(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "herald")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// dataDir is a fresh directory the postgres user can reach (t.TempDir's
// parent is root-only).
func dataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "herald-serve-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755)) // #nosec G302 -- postgres must traverse it
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

type proc struct {
	cmd  *exec.Cmd
	url  string
	done chan error

	mu       sync.Mutex
	logs     []string // the JSON log lines written so far
	problems []string // the first warn and error lines it logged
}

// logged returns the log lines written so far.
func (p *proc) logged() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.logs)
}

// problemLines returns the first warn and error lines herald logged.
func (p *proc) problemLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.problems, "\n")
}

// startHerald runs `herald serve` and waits for its "herald is serving" log
// line, which carries the URL to open.
func startHerald(t *testing.T, bin, dir string, extra ...string) *proc {
	t.Helper()
	return startCommand(t, exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir}, extra...)...))
}

// startHeraldLimited is startHerald under an open-file limit of nofile
// (soft and hard), set by the shell that then becomes herald.
func startHeraldLimited(t *testing.T, nofile int, bin, dir string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"-c", `ulimit -n "$0" && exec "$@"`, strconv.Itoa(nofile), bin,
		"serve", "--addr", "127.0.0.1:0", "--data-dir", dir}, extra...)
	return startCommand(t, exec.Command("/bin/sh", args...))
}

// startCommand runs cmd, a `herald serve`, as startHerald does.
func startCommand(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs = append(p.logs, sc.Text())
			p.mu.Unlock()
			var line struct{ Level, Message, URL string }
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			if line.Message == "herald is serving" {
				urls <- line.URL
			}
			if line.Level == "warn" || line.Level == "error" {
				p.mu.Lock()
				if len(p.problems) < 50 {
					p.problems = append(p.problems, sc.Text())
				}
				p.mu.Unlock()
			}
		}
		_, _ = io.Copy(io.Discard, stderr) // a line too long for the scanner
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	select {
	case p.url = <-urls:
	case err := <-p.done:
		t.Fatalf("herald exited before serving: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("herald did not start within 2 minutes")
	}
	return p
}

func (p *proc) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
	select {
	case err := <-p.done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("herald did not exit within a minute")
		return nil
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// longPoll GETs url in the background and sends its status (-1: no answer).
func longPoll(url string) <-chan int {
	done := make(chan int, 1)
	go func() {
		res, err := http.Get(url)
		if err != nil {
			done <- -1
			return
		}
		_ = res.Body.Close()
		done <- res.StatusCode
	}()
	return done
}

func pushOne(t *testing.T, base, queue, payload string) {
	t.Helper()
	resp, err := http.Post(base+"api/v1/push", "application/json",
		strings.NewReader(fmt.Sprintf(`{"items":[{"queue":%q,"payload":%s}]}`, queue, payload)))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}

// postmaster reports the pid of the private cluster's postmaster, 0 if none.
func postmaster(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "postgres", "pgdata", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	return pid
}

// gone waits until process pid has exited (pg_ctl stop returns when the
// postmaster.pid is removed, a moment before the process is gone).
func gone(t *testing.T, pid int, msg string) {
	t.Helper()
	require.Eventually(t, func() bool { return !alive(pid) }, 30*time.Second, 20*time.Millisecond, msg)
}

// alive reports whether pid runs. A zombie counts as dead: in some sandboxes
// PID 1 never reaps the daemonised postmaster.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// The private PostgreSQL: first start runs initdb, SIGTERM stops it, a second
// start reuses the data, and after herald is killed the next herald adopts
// the orphaned postmaster and stops it on exit.
func TestServe_PrivatePostgresLifecycle(t *testing.T) {
	bin := buildHerald(t)
	dir := dataDir(t)

	p := startHerald(t, bin, dir)
	code, body := get(t, p.url+"health")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"database":"connected"`)
	code, _ = get(t, p.url)
	assert.Equal(t, http.StatusOK, code, "the page at the logged URL")
	pushOne(t, p.url, "lifecycle", `{"n":1}`)
	pm := postmaster(dir)
	require.True(t, alive(pm))
	require.NoError(t, p.stop(t, syscall.SIGTERM), "clean exit on SIGTERM")
	gone(t, pm, "SIGTERM stopped the private PostgreSQL")

	// Same data dir: the cluster is reused, the message is still there.
	p = startHerald(t, bin, dir)
	code, body = get(t, p.url+"api/v1/pop/queue/lifecycle?wait=false")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"data":{"n":1}`)

	// A crash leaves the postmaster running; the next herald adopts it.
	pm = postmaster(dir)
	_ = p.stop(t, syscall.SIGKILL)
	require.True(t, alive(pm), "postgres outlives a killed herald")
	p = startHerald(t, bin, dir)
	code, _ = get(t, p.url+"health")
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, p.stop(t, syscall.SIGINT))
	gone(t, pm, "the last herald stopped the adopted postmaster")
}

func TestMigrate_Command(t *testing.T) {
	bin := buildHerald(t)
	dir := dataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < 2; i++ {
		out, err := exec.CommandContext(ctx, bin, "migrate", "--data-dir", dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
		if i == 0 {
			assert.Regexp(t, `"applied":\[1(,\d+)*\]`, string(out), "every migration applied")
		} else {
			assert.Contains(t, string(out), `"applied":[]`, "idempotent")
		}
	}
	assert.Equal(t, 0, postmaster(dir), "migrate stops the private PostgreSQL it started")
}

// With --database-url, herald uses that database (here a schema of the test
// cluster) and starts no PostgreSQL of its own.
func TestServe_ExternalDatabase(t *testing.T) {
	bin := buildHerald(t)
	dir := dataDir(t)
	dsn := pgtest.DSN(t)
	p := startHerald(t, bin, dir, "--database-url", dsn)
	pushOne(t, p.url, "external", `{"n":7}`)
	code, body := get(t, p.url+"api/v1/pop/queue/external?wait=false")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"data":{"n":7}`)
	code, body = get(t, p.url+"metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `herald_messages_pushed_total{queue="external"} 1`)
	require.NoError(t, p.stop(t, syscall.SIGTERM))
	_, err := os.Stat(filepath.Join(dir, "postgres"))
	assert.True(t, os.IsNotExist(err), "no private PostgreSQL was created")
}

// Each wake mode starts and serves a long-poll.
func TestServe_WakeModes(t *testing.T) {
	bin := buildHerald(t)
	for _, mode := range []string{"notify", "logical", "poll"} {
		t.Run(mode, func(t *testing.T) {
			p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--wake", mode)
			done := longPoll(p.url + "api/v1/pop/queue/wm?wait=true&timeout=20000")
			// Push once the long-poll waits, so the wake-up must reach it.
			require.Eventually(t, func() bool {
				_, body := get(t, p.url+"metrics")
				return strings.Contains(body, "\nherald_intentions 1\n")
			}, 10*time.Second, 10*time.Millisecond)
			pushOne(t, p.url, "wm", `{"mode":1}`)
			select {
			case code := <-done:
				assert.Equal(t, http.StatusOK, code)
			case <-time.After(15 * time.Second):
				t.Fatal("long-poll did not return")
			}
			require.NoError(t, p.stop(t, syscall.SIGTERM))
		})
	}
}

// Graceful shutdown: SIGTERM stops leasing, closes the WebSocket with 4000
// and ends the SSE stream with a retry:, within the drain window, gives the
// leases back and exits. Another herald then gets the unacked messages at
// once (the lease time is 300 s).
func TestServe_GracefulShutdownReleasesLeases(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--drain-window", "500ms")
	wsURL := "ws" + strings.TrimPrefix(p.url, "http") + "api/v1/ws"
	ws, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}}).Dial(wsURL, nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	defer func() { _ = ws.Close() }()
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","id":1,"queue":"bye-ws"}`)))
	sse, err := http.Get(p.url + "api/v1/sse/queue/bye-sse")
	require.NoError(t, err)
	defer func() { _ = sse.Body.Close() }()
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, _, err = ws.ReadMessage() // subscribed
	require.NoError(t, err)
	pushOne(t, p.url, "bye-ws", `{"n":1}`)
	pushOne(t, p.url, "bye-sse", `{"n":2}`)
	_, frame, err := ws.ReadMessage()
	require.NoError(t, err)
	require.Contains(t, string(frame), `"deliver"`)
	sc := bufio.NewScanner(sse.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
	}
	require.Contains(t, sc.Text(), `"n":2`)

	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	_, _, err = ws.ReadMessage()
	assert.True(t, websocket.IsCloseError(err, 4000), "%v", err)
	lastRetry := ""
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "retry: ") {
			lastRetry = sc.Text()
		}
	}
	assert.NotEmpty(t, lastRetry, "the SSE stream ends with a retry:")
	select {
	case err := <-p.done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("herald did not exit")
	}
	assert.Less(t, time.Since(start), 15*time.Second)

	q := startHerald(t, bin, dataDir(t), "--database-url", dsn)
	for _, queue := range []string{"bye-ws", "bye-sse"} {
		code, body := get(t, q.url+"api/v1/pop/queue/"+queue+"?wait=false")
		assert.Equal(t, http.StatusOK, code, "%s: %s", queue, body)
	}
	require.NoError(t, q.stop(t, syscall.SIGTERM))
}

// freeUDP returns a loopback UDP address nobody listens on.
func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := c.LocalAddr().String()
	require.NoError(t, c.Close())
	return addr
}

// metricValue reads one sample from a /metrics page ("" labels: the bare name).
func metricValue(t *testing.T, base, series string) float64 {
	t.Helper()
	_, body := get(t, base+"metrics")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimPrefix(line, series+" "), 64)
			require.NoError(t, err)
			return v
		}
	}
	return 0
}

// Three instances with syncnet on loopback, a consumer on C only: a push
// through A sends MESSAGE_AVAILABLE to C and nothing to B, and C delivers.
func TestServe_SyncnetTargetsTheInstanceWithConsumers(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	secret := strings.Repeat("ab", 32)
	addrs := []string{freeUDP(t), freeUDP(t), freeUDP(t)}
	var ps []*proc
	for i, name := range []string{"a", "b", "c"} {
		var peers []string
		for j, a := range addrs {
			if j != i {
				peers = append(peers, a)
			}
		}
		ps = append(ps, startHerald(t, bin, dataDir(t), "--database-url", dsn, "--sync-bind", addrs[i],
			"--sync-peers", strings.Join(peers, ","), "--sync-secret", secret, "--server-id", name))
	}
	a, b, c := ps[0], ps[1], ps[2]
	done := longPoll(c.url + "api/v1/pop/queue/sq?wait=true&timeout=20000&autoAck=true")
	// A learns that C has a consumer for sq, and B's presence.
	meshView := func() bool {
		_, body := get(t, a.url+"internal/api/shared-state/stats")
		var st struct {
			Syncnet struct {
				Peers []struct {
					ID     string   `json:"id"`
					Known  bool     `json:"presenceKnown"`
					Alive  bool     `json:"alive"`
					Queues []string `json:"queuesWithSubscribers"`
				} `json:"peers"`
			} `json:"syncnet"`
		}
		if json.Unmarshal([]byte(body), &st) != nil || len(st.Syncnet.Peers) != 2 {
			return false
		}
		ok := true
		for _, p := range st.Syncnet.Peers {
			ok = ok && p.Known && p.Alive && (p.ID != "c" || slices.Contains(p.Queues, "sq"))
		}
		return ok
	}
	require.Eventually(t, meshView, 20*time.Second, 50*time.Millisecond, "A's view of the mesh")

	// Push through A, C's consumer answers, woken by A's MESSAGE_AVAILABLE
	// (the datagram counts below; the median is 6 ms on an idle machine,
	// which herald-bench cluster measures, not this test).
	var took []time.Duration
	for i := range 7 {
		if i > 0 {
			done = longPoll(c.url + "api/v1/pop/queue/sq?wait=true&timeout=20000&autoAck=true")
			require.Eventually(t, func() bool { return metricValue(t, c.url, "herald_intentions") == 1 && meshView() },
				10*time.Second, time.Millisecond, "C's consumer waits, and A knows")
		}
		start := time.Now()
		pushOne(t, a.url, "sq", fmt.Sprintf(`{"n":%d}`, i))
		select {
		case code := <-done:
			took = append(took, time.Since(start))
			assert.Equal(t, http.StatusOK, code)
		case <-time.After(10 * time.Second):
			t.Fatal("C's long-poll did not return")
		}
	}
	slices.Sort(took)
	t.Logf("push through A → delivery on C: %v", took)
	const avail = `herald_syncnet_received_total{type="message_available"}`
	const sentAvail = `herald_syncnet_sent_total{type="message_available"}`
	assert.Equal(t, 7.0, metricValue(t, a.url, sentAvail), "one datagram per push, to C")
	assert.Equal(t, 7.0, metricValue(t, c.url, avail))
	assert.Zero(t, metricValue(t, b.url, avail), "B has no consumer: nothing sent to it")
	_, body := get(t, a.url+"internal/api/shared-state/stats")
	var st struct {
		Caches struct {
			PartitionIDs struct{ Hits, Misses uint64 } `json:"partitionIds"`
		} `json:"caches"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	assert.Equal(t, uint64(1), st.Caches.PartitionIDs.Misses, "A looked sq/Default up once")
	assert.Equal(t, uint64(6), st.Caches.PartitionIDs.Hits)

	// C is killed: A sees it gone within 10 s (a member leaves once its
	// members row is 7 s old, read every 2 s) and stops targeting it.
	require.NoError(t, c.cmd.Process.Kill())
	killed := time.Now()
	require.Eventually(t, func() bool {
		_, body := get(t, a.url+"internal/api/shared-state/stats")
		var st struct {
			Syncnet struct {
				Peers []struct {
					ID    string `json:"id"`
					Alive bool   `json:"alive"`
				} `json:"peers"`
			} `json:"syncnet"`
		}
		if json.Unmarshal([]byte(body), &st) != nil {
			return false
		}
		return !slices.ContainsFunc(st.Syncnet.Peers, func(p struct {
			ID    string `json:"id"`
			Alive bool   `json:"alive"`
		}) bool {
			return p.ID == "c" && p.Alive
		})
	}, 20*time.Second, 50*time.Millisecond)
	t.Logf("A saw C dead %v after the kill", time.Since(killed))
	assert.Less(t, time.Since(killed), 10*time.Second)
	pushOne(t, a.url, "sq", `{"n":8}`)
	_, stats := get(t, a.url+"internal/api/shared-state/stats")
	assert.Equal(t, 7.0, metricValue(t, a.url, sentAvail), "nothing to a dead peer, nor to B without consumers: %s", stats)
	assert.Zero(t, metricValue(t, b.url, avail), "B has no consumer: nothing sent to it")
	for _, p := range ps[:2] {
		require.NoError(t, p.stop(t, syscall.SIGTERM))
	}
}

// Peers without a valid secret: refused at start.
func TestServe_SyncnetNeedsASecret(t *testing.T) {
	_, err := parseConfig("serve", []string{"--sync-peers", "127.0.0.1:7000", "--sync-secret", "short"}, func(string) string { return "" }, io.Discard)
	assert.ErrorContains(t, err, "--sync-secret")
}

// sseOutcome is how a herald answered one SSE request.
type sseOutcome int

const (
	sseOpen   sseOutcome = iota // 200 ": connected": a stream
	sseRetry                    // 200 with only a retry: delay, then closed: refused
	sseFailed                   // no answer, another status, or a broken connection
	sseOutcomes
)

// openSSE opens an SSE stream on a raw connection and reads up to its first
// event: an open stream's body reader is returned to read it on.
func openSSE(addr, path string, deadline time.Time) (sseOutcome, net.Conn, *bufio.Reader, string) {
	conn, err := net.DialTimeout("tcp", addr, time.Until(deadline))
	if err != nil {
		return sseFailed, nil, nil, err.Error()
	}
	_ = conn.SetDeadline(deadline)
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", path, addr); err != nil {
		_ = conn.Close()
		return sseFailed, nil, nil, err.Error()
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil) //nolint:bodyclose // the body is the connection's, closed with it (every return closes conn or hands it to the caller)
	if err != nil {
		_ = conn.Close()
		return sseFailed, nil, nil, err.Error()
	}
	if res.StatusCode != http.StatusOK {
		_ = conn.Close()
		return sseFailed, nil, nil, res.Status
	}
	body := bufio.NewReader(res.Body)
	for {
		line, err := body.ReadString('\n')
		switch {
		case strings.HasPrefix(line, ": connected"):
			_ = conn.SetDeadline(time.Time{})
			return sseOpen, conn, body, ""
		case err == io.EOF && line == "":
			_ = conn.Close()
			return sseRetry, nil, nil, ""
		case err != nil:
			_ = conn.Close()
			return sseFailed, nil, nil, err.Error()
		}
	}
}

// A herald under a 1,024 open-file limit, offered 1,500 SSE streams and a few
// WebSockets: it admits what its descriptors allow (a cap below the limit,
// with a reserve for PostgreSQL and its files) and answers the rest at once
// (SSE 200 + retry:, WebSocket 503), keeps running with the same private
// PostgreSQL, reports the cap and the count in /health and the refusals in
// /metrics, and every admitted stream still receives what is pushed.
func TestServe_ConnectionsPastTheDescriptorLimitAreRefusedAndTheInstanceLives(t *testing.T) {
	const nofile, offered, nWS = 1024, 1500, 4
	bin := buildHerald(t)
	dir := dataDir(t)
	p := startHeraldLimited(t, nofile, bin, dir)
	pm := postmaster(dir)
	require.True(t, alive(pm))
	addr := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://"), "/")
	wsURL := "ws://" + addr + "/api/v1/ws"
	exited := func() bool {
		select {
		case err := <-p.done:
			p.done <- err
			return true
		default:
			return false
		}
	}

	// WebSockets first, each with a group of its own: they are admitted.
	var wss []*websocket.Conn
	for i := range nWS {
		ws, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}}).Dial(wsURL, nil)
		require.NoError(t, err)
		_ = res.Body.Close()
		t.Cleanup(func() { _ = ws.Close() })
		require.NoError(t, ws.WriteMessage(websocket.TextMessage,
			fmt.Appendf(nil, `{"type":"subscribe","id":1,"queue":"fd","consumerGroup":"ws%d","autoAck":true}`, i)))
		require.NoError(t, ws.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, frame, err := ws.ReadMessage()
		require.NoError(t, err)
		require.Contains(t, string(frame), `"subscribed"`)
		wss = append(wss, ws)
	}

	// The flood: 1,500 SSE streams, 32 at a time, each with a group of its
	// own (so that one push reaches every one of them).
	type stream struct {
		conn net.Conn
		body *bufio.Reader
	}
	var (
		mu      sync.Mutex
		streams []stream
		counts  [sseOutcomes]int
		why     []string
	)
	deadline := time.Now().Add(60 * time.Second)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range next {
				o, conn, body, reason := openSSE(addr, fmt.Sprintf("/api/v1/sse/queue/fd?consumerGroup=sse%d&autoAck=true", i), deadline)
				mu.Lock()
				counts[o]++
				if o == sseOpen {
					streams = append(streams, stream{conn, body})
				}
				if reason != "" && len(why) < 5 {
					why = append(why, reason)
				}
				mu.Unlock()
			}
		})
	}
	for i := range offered {
		next <- i
	}
	close(next)
	wg.Wait()
	flooded := time.Now()
	t.Cleanup(func() {
		for _, s := range streams {
			_ = s.conn.Close()
		}
	})
	t.Logf("%d SSE requests: %d streams, %d answered retry:, %d failed %v", offered, counts[sseOpen], counts[sseRetry], counts[sseFailed], why)
	require.False(t, exited(), "herald exited: %s", p.problemLines())
	require.Zero(t, counts[sseFailed], "every request is answered: %v\n%s", why, p.problemLines())
	require.NotZero(t, counts[sseRetry], "past the cap, SSE is answered 200 with retry:")
	require.Greater(t, counts[sseOpen], offered/2, "most of the limit serves streams")

	// A WebSocket past the cap: 503 with Retry-After, before the upgrade.
	_, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}}).Dial(wsURL, nil)
	require.Error(t, err)
	require.NotNil(t, res, "%v", err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	assert.NotEmpty(t, res.Header.Get("Retry-After"))

	// The instance and its PostgreSQL stay: /health answers (past the cap
	// too) through the time a supervisor that took EMFILE for a dead
	// postmaster would have given up (five attempts, about 6 s).
	var health struct {
		Status         string `json:"status"`
		Database       string `json:"database"`
		Connections    int    `json:"connections"`
		MaxConnections int    `json:"maxConnections"`
	}
	// The span is the point (the supervisor's give-up time): probes at a
	// steady pace, each asserting.
	probe := time.NewTicker(250 * time.Millisecond)
	defer probe.Stop()
	for time.Since(flooded) < 10*time.Second {
		code, body := get(t, p.url+"health")
		require.Equal(t, http.StatusOK, code, "%s\n%s", body, p.problemLines())
		require.NoError(t, json.Unmarshal([]byte(body), &health))
		require.False(t, exited())
		<-probe.C
	}
	assert.Equal(t, "connected", health.Database)
	assert.Equal(t, pm, postmaster(dir), "the same postmaster")
	assert.True(t, alive(pm), "the postmaster runs")
	streamsOpen := counts[sseOpen] + nWS
	assert.Positive(t, health.MaxConnections)
	assert.Less(t, health.MaxConnections, nofile, "the cap keeps a reserve below the limit")
	assert.GreaterOrEqual(t, health.Connections, streamsOpen, "every open stream is counted")
	assert.LessOrEqual(t, health.Connections, health.MaxConnections)

	// One push, through an admitted connection: every stream receives it.
	require.NoError(t, wss[0].WriteMessage(websocket.TextMessage,
		[]byte(`{"type":"push","id":"p","items":[{"queue":"fd","payload":{"n":1}}]}`)))
	received := make(chan bool, len(streams)+nWS)
	for _, s := range streams {
		go func() {
			_ = s.conn.SetReadDeadline(time.Now().Add(60 * time.Second))
			for {
				line, err := s.body.ReadString('\n')
				if err != nil {
					received <- false
					return
				}
				if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"n":1`) {
					received <- true
					return
				}
			}
		}()
	}
	for _, ws := range wss {
		go func() {
			_ = ws.SetReadDeadline(time.Now().Add(60 * time.Second))
			for {
				_, frame, err := ws.ReadMessage()
				if err != nil {
					received <- false
					return
				}
				if strings.Contains(string(frame), `"deliver"`) && strings.Contains(string(frame), `"n":1`) {
					received <- true
					return
				}
			}
		}()
	}
	got := 0
	for range len(streams) + nWS {
		if <-received {
			got++
		}
	}
	assert.Equal(t, streamsOpen, got, "every admitted stream receives the push")

	refused := counts[sseRetry] + 1 // and the WebSocket
	assert.Equal(t, float64(refused), metricValue(t, p.url, `herald_connections_refused_total{reason="limit"}`),
		"each refusal is counted")
	require.False(t, exited(), "herald exited: %s", p.problemLines())
	require.NoError(t, p.stop(t, syscall.SIGTERM))
}
