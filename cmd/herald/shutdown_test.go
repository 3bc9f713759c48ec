package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// shutdownLoad is what a busy instance holds when it is told to stop:
// WebSockets and SSE streams with leased, unacknowledged messages,
// long-polls waiting with a long timeout, idle keep-alive connections, a
// connection that has sent nothing and one that sends its headers slowly,
// and clients that reconnect the moment they are closed (as the SDKs and
// EventSource do).
type shutdownLoad struct {
	t    *testing.T
	base string // http://host:port/
	ws   string // ws://host:port/api/v1/ws

	stop    chan struct{}
	wg      sync.WaitGroup
	polls   []<-chan int
	closers []func()

	// Streams a reconnecting client opened after the drain began: each
	// one the instance accepted only to close it.
	reopened atomic.Int64
	draining atomic.Bool
}

func newShutdownLoad(t *testing.T, base string) *shutdownLoad {
	return &shutdownLoad{t: t, base: base, ws: "ws" + strings.TrimPrefix(base, "http") + "api/v1/ws", stop: make(chan struct{})}
}

// wsSubscribe opens a WebSocket subscribed to queue and reads until its
// first delivery.
func (l *shutdownLoad) wsSubscribe(queue string) (*websocket.Conn, error) {
	ws, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}, HandshakeTimeout: 5 * time.Second}).Dial(l.ws, nil) //nolint:bodyclose // refused closes it
	if err != nil {
		return nil, err
	}
	_ = res.Body.Close()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"type":"subscribe","id":1,"queue":%q}`, queue))); err != nil {
		_ = ws.Close()
		return nil, err
	}
	return ws, nil
}

// holdWS keeps n WebSockets, each with one message leased and unacked.
func (l *shutdownLoad) holdWS(n int) {
	for i := range n {
		q := fmt.Sprintf("sd-ws-%d", i)
		pushOne(l.t, l.base, q, `{"n":1}`)
		ws, err := l.wsSubscribe(q)
		require.NoError(l.t, err)
		l.closers = append(l.closers, func() { _ = ws.Close() })
		require.NoError(l.t, ws.SetReadDeadline(time.Now().Add(10*time.Second)))
		for {
			_, frame, err := ws.ReadMessage()
			require.NoError(l.t, err)
			if strings.Contains(string(frame), `"deliver"`) {
				break
			}
		}
		require.NoError(l.t, ws.SetReadDeadline(time.Time{}))
		l.wg.Go(func() { // read until closed
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		})
	}
}

// holdSSE keeps n SSE streams, each with one message delivered and
// unacknowledged.
func (l *shutdownLoad) holdSSE(n int) {
	for i := range n {
		q := fmt.Sprintf("sd-sse-%d", i)
		pushOne(l.t, l.base, q, `{"n":1}`)
		res, err := http.Get(l.base + "api/v1/sse/queue/" + q) //nolint:bodyclose // closed by l.closers when the load ends
		require.NoError(l.t, err)
		l.closers = append(l.closers, func() { _ = res.Body.Close() })
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
		}
		require.NoError(l.t, sc.Err())
		l.wg.Go(func() { _, _ = io.Copy(io.Discard, res.Body) })
	}
}

// holdLongPolls keeps n long-polls waiting (60 s timeout).
func (l *shutdownLoad) holdLongPolls(n int) {
	for i := range n {
		l.polls = append(l.polls, longPoll(fmt.Sprintf("%sapi/v1/pop/queue/sd-lp-%d?wait=true&timeout=60000", l.base, i)))
	}
	require.Eventually(l.t, func() bool { return metricValue(l.t, l.base, "herald_intentions") >= float64(n) },
		10*time.Second, 10*time.Millisecond, "the long-polls wait")
}

// holdIdle keeps n idle keep-alive connections, a connection that has sent
// nothing and one that has sent half its request headers.
func (l *shutdownLoad) holdIdle(n int) {
	for range n {
		c := &http.Client{Transport: &http.Transport{}}
		res, err := c.Get(l.base + "health")
		require.NoError(l.t, err)
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		l.closers = append(l.closers, c.CloseIdleConnections)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(l.base, "http://"), "/")
	silent, err := net.Dial("tcp", addr)
	require.NoError(l.t, err)
	slow, err := net.Dial("tcp", addr)
	require.NoError(l.t, err)
	_, err = slow.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n"))
	require.NoError(l.t, err)
	l.closers = append(l.closers, func() { _ = silent.Close(); _ = slow.Close() })
}

// holdSlowBody keeps a push in flight whose body trickles in (its read
// deadline, --body-read-timeout, is 10 s away).
func (l *shutdownLoad) holdSlowBody() {
	addr := strings.TrimSuffix(strings.TrimPrefix(l.base, "http://"), "/")
	c, err := net.Dial("tcp", addr)
	require.NoError(l.t, err)
	_, err = c.Write([]byte("POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"items\":"))
	require.NoError(l.t, err)
	l.closers = append(l.closers, func() { _ = c.Close() })
}

// reconnecting runs n WebSocket and n SSE clients that open their stream
// again as soon as it closes, counting what the instance accepted once it
// was draining.
func (l *shutdownLoad) reconnecting(n int) {
	for i := range n {
		q := fmt.Sprintf("sd-again-%d", i)
		l.wg.Go(func() {
			for !l.stopped() {
				ws, err := l.wsSubscribe(q)
				if err != nil {
					l.pause()
					continue
				}
				if l.draining.Load() {
					l.reopened.Add(1)
				}
				for {
					if _, _, err := ws.ReadMessage(); err != nil {
						break
					}
				}
				_ = ws.Close()
			}
		})
		l.wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			for !l.stopped() {
				res, err := c.Get(l.base + "api/v1/sse/queue/" + q)
				if err != nil {
					l.pause()
					continue
				}
				if l.draining.Load() && res.StatusCode == http.StatusOK {
					l.reopened.Add(1)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				l.pause() // EventSource waits retry: (≥ 1 s); a little is enough here
			}
		})
	}
}

func (l *shutdownLoad) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *shutdownLoad) pause() {
	select {
	case <-l.stop:
	case <-time.After(20 * time.Millisecond):
	}
}

// close ends every client.
func (l *shutdownLoad) close() {
	close(l.stop)
	for _, c := range l.closers {
		c()
	}
	l.wg.Wait()
}

// SIGTERM to an instance with WebSockets, SSE streams, waiting long-polls,
// idle and half-open connections and reconnecting clients: the process has
// exited within the drain window and a second (the promise), with a margin
// for a busy machine.
func TestShutdown_EndsWithinTheDrainWindow(t *testing.T) {
	bin := buildHerald(t)
	const window = 2 * time.Second
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--drain-window", window.String())
	l := newShutdownLoad(t, p.url)
	defer l.close()
	l.holdWS(4)
	l.holdSSE(4)
	l.holdLongPolls(4)
	l.holdIdle(2)
	l.holdSlowBody()
	l.reconnecting(2)

	start := time.Now()
	l.draining.Store(true)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	for i, c := range l.polls {
		select {
		case code := <-c:
			assert.Equal(t, http.StatusNoContent, code, "long-poll %d is answered at once", i)
		case <-time.After(10 * time.Second):
			t.Errorf("long-poll %d still waits 10 s after SIGTERM", i)
		}
	}
	var took time.Duration
	select {
	case err := <-p.done:
		took = time.Since(start)
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("herald did not exit within 60 s of SIGTERM")
	}
	t.Logf("SIGTERM → exit: %v (drain window %v); streams accepted while draining: %d", took, window, l.reopened.Load())
	for _, line := range p.logged() {
		if strings.Contains(line, "shutting down") || strings.Contains(line, "stopped") || strings.Contains(line, `"level":"warn"`) {
			t.Log(line)
		}
	}
	// The promise is the window and a second; two more absorb a machine
	// shared with other builds (the process must also stop its loops and
	// close its pool).
	assert.Less(t, took, window+time.Second+2*time.Second, "SIGTERM → exit")
}

// Once SIGTERM has been taken (the "shutting down" line), a new WebSocket,
// SSE stream or long-poll is not accepted: the connection is refused, or
// answered 503 with a Retry-After, so the client goes to another instance
// instead of being accepted only to be closed.
func TestShutdown_RefusesNewStreamsWhileDraining(t *testing.T) {
	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--drain-window", "5s")
	l := newShutdownLoad(t, p.url)
	defer l.close()
	l.holdWS(1) // a stream to drain

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(p.logged(), func(s string) bool { return strings.Contains(s, `"message":"shutting down"`) })
	}, 10*time.Second, 5*time.Millisecond, "the drain began")

	refused := func(what string, res *http.Response, err error) {
		t.Helper()
		if err != nil && res == nil {
			return // not connected: refused
		}
		require.NotNil(t, res, "%s: %v", what, err)
		defer func() { _ = res.Body.Close() }()
		assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "%s is not accepted while draining", what)
		assert.NotEmpty(t, res.Header.Get("Retry-After"), "%s: Retry-After", what)
	}
	ws, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}, HandshakeTimeout: 5 * time.Second}).Dial(l.ws, nil) //nolint:bodyclose // refused closes it
	if ws != nil {
		_ = ws.Close()
	}
	refused("a WebSocket", res, err)
	c := &http.Client{Timeout: 10 * time.Second}
	res, err = c.Get(p.url + "api/v1/sse/queue/sd-new")
	if err == nil && res.StatusCode == http.StatusOK {
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		t.Errorf("an SSE stream was accepted while draining: %q", body)
	} else {
		refused("an SSE stream", res, err)
	}
	res, err = c.Get(p.url + "api/v1/pop/queue/sd-new?wait=true&timeout=30000") //nolint:bodyclose // refused closes it
	refused("a long-poll", res, err)
	select {
	case err := <-p.done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("herald did not exit")
	}
}
