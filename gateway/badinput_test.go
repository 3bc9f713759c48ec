package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

// TestBadInputSweep throws malformed and hostile input at a running
// instance, all at once, while a producer and a consumer carry on: every
// answer is the documented 4xx or close code, the instance stays healthy,
// and the bystanders lose nothing and see nothing twice or out of order.
func TestBadInputSweep(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.BodyLimit = 64 << 10 })
	host := strings.TrimPrefix(e.url, "http://")

	// Bystanders: a producer every 5 ms and a long-poll consumer.
	stop := make(chan struct{})
	var pushed int
	var bwg sync.WaitGroup
	bwg.Go(func() {
		for ; ; pushed++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			res, err := http.Post(e.url+"/api/v1/push", "application/json",
				strings.NewReader(fmt.Sprintf(`{"items":[{"queue":"bystander","payload":{"n":%d}}]}`, pushed)))
			if !assert.NoError(t, err) {
				return
			}
			_ = res.Body.Close()
			assert.Equal(t, http.StatusCreated, res.StatusCode)
		}
	})
	var got []int
	consumed := make(chan struct{})
	var want int
	var wantMu sync.Mutex
	go func() {
		defer close(consumed)
		for {
			res, err := http.Get(e.url + "/api/v1/pop/queue/bystander?wait=true&timeout=500&batch=100&autoAck=true")
			if !assert.NoError(t, err) {
				return
			}
			var pop struct {
				Messages []struct {
					Data struct{ N int } `json:"data"`
				} `json:"messages"`
			}
			if res.StatusCode == http.StatusOK {
				assert.NoError(t, json.NewDecoder(res.Body).Decode(&pop))
			}
			_ = res.Body.Close()
			for _, m := range pop.Messages {
				got = append(got, m.Data.N)
			}
			wantMu.Lock()
			w := want
			wantMu.Unlock()
			if w > 0 && len(got) >= w {
				return
			}
		}
	}()

	long := strings.Repeat("q", 1024)
	huge := `{"items":[{"queue":"q","payload":"` + strings.Repeat("x", 70<<10) + `"}]}`
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"malformed JSON", "POST", "/api/v1/push", `{"items":[`, 400},
		{"trailing garbage", "POST", "/api/v1/push", `{"items":[]} x`, 400},
		{"wrong type items", "POST", "/api/v1/push", `{"items":"x"}`, 400},
		{"wrong type queue", "POST", "/api/v1/push", `{"items":[{"queue":["q"]}]}`, 400},
		{"huge body", "POST", "/api/v1/push", huge, 413},
		{"invalid UTF-8 in a name", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"\xff\xfe\",\"payload\":1}]}", 400},
		{"invalid UTF-8 in a payload", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"q\",\"payload\":\"\xc3\x28\"}]}", 400},
		{"empty name", "POST", "/api/v1/push", `{"items":[{"queue":"","payload":1}]}`, 400},
		{"1 KB name", "POST", "/api/v1/push", `{"items":[{"queue":"` + long + `","payload":1}]}`, 400},
		{"control character in a name", "POST", "/api/v1/push", `{"items":[{"queue":"a\u0001b","payload":1}]}`, 400},
		{"NUL in a payload", "POST", "/api/v1/push", `{"items":[{"queue":"q","payload":"a\u0000b"}]}`, 400},
		{"1 KB name in a path", "GET", "/api/v1/pop/queue/" + long + "?wait=false", "", 400},
		{"control character in a path", "GET", "/api/v1/pop/queue/a%01b?wait=false", "", 400},
		{"invalid UTF-8 in a path", "GET", "/api/v1/pop/queue/%FF%FE?wait=false", "", 400},
		{"bad batch", "GET", "/api/v1/pop/queue/q?batch=-1", "", 400},
		{"bad timeout", "GET", "/api/v1/pop/queue/q?wait=true&timeout=soon", "", 400},
		{"bad ack", "POST", "/api/v1/ack", `{"transactionId":7}`, 400},
		{"ack of a malformed id", "POST", "/api/v1/ack", `{"transactionId":"t","partitionId":"not-a-uuid"}`, 200},
		{"bad configure", "POST", "/api/v1/configure", `{"queue":"q","options":{"leaseTime":-5}}`, 400},
		{"bad transaction", "POST", "/api/v1/transaction", `{"operations":[{"type":"nope"}]}`, 400},
		{"bad DLQ query", "GET", "/api/v1/dlq?limit=lots", "", 400},
		{"bad SSE parameters", "GET", "/api/v1/sse/queue/q?batch=0", "", 400},
		{"malformed Last-Event-ID", "GET", "/api/v1/sse/queue/q?lastEventId=%21%21%21", "", 400},
		{"unknown route", "GET", "/api/v1/nope", "", 404},
		{"unknown method", "PATCH", "/api/v1/push", `{}`, 404},
	}
	var wg sync.WaitGroup
	for _, c := range cases {
		for range 4 { // each several times, all at once
			wg.Go(func() {
				req, err := http.NewRequest(c.method, e.url+c.path, strings.NewReader(c.body))
				if !assert.NoError(t, err) {
					return
				}
				req.Header.Set("Content-Type", "application/json")
				res, err := http.DefaultClient.Do(req)
				if !assert.NoError(t, err, c.name) {
					return
				}
				defer func() { _ = res.Body.Close() }()
				b, _ := io.ReadAll(res.Body)
				assert.Equal(t, c.want, res.StatusCode, "%s: %s", c.name, b)
				if c.want >= 400 {
					assert.Contains(t, string(b), `"error"`, c.name)
				}
			})
		}
	}

	// Malformed WebSocket frames get an error frame; the connection and
	// its other traffic carry on.
	ws, wsRes, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/api/v1/ws", nil)
	require.NoError(t, err)
	_ = wsRes.Body.Close()
	for _, frame := range []string{"{", "[]", "\xff\xfe", `{"type":"nope"}`, `{"type":"subscribe"}`} {
		require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(frame)))
		var f struct{ Type, Code string }
		require.NoError(t, ws.ReadJSON(&f), frame)
		assert.Equal(t, "error", f.Type, "%q", frame)
	}
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ping","id":"p"}`)))
	var pong struct{ Type string }
	require.NoError(t, ws.ReadJSON(&pong))
	assert.Equal(t, "pong", pong.Type, "still serving after bad frames")
	_ = ws.Close()

	// Half-open WebSockets (upgraded, then silent), slowloris requests (a
	// header byte now and then) and SSE clients that never read.
	var raw []net.Conn
	dial := func() net.Conn {
		c, err := net.Dial("tcp", host)
		require.NoError(t, err)
		raw = append(raw, c)
		return c
	}
	for range 20 {
		c := dial()
		_, err := fmt.Fprintf(c, "GET /api/v1/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
		require.NoError(t, err)
		status, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		assert.Contains(t, status, "101")
	}
	for range 20 {
		c := dial()
		_, err := fmt.Fprintf(c, "GET /api/v1/sse/queue/bystander?consumerGroup=stalled HTTP/1.1\r\nHost: %s\r\n", host)
		require.NoError(t, err) // the rest of the headers never come
	}
	for i := range 20 {
		c := dial()
		_, err := fmt.Fprintf(c, "GET /api/v1/sse/queue/bystander?consumerGroup=never-reads-%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, host)
		require.NoError(t, err) // a stream that is never read
	}
	slow := time.NewTicker(100 * time.Millisecond)
	for range 10 {
		<-slow.C
		for _, c := range raw[20:40] {
			_, _ = c.Write([]byte("X")) // one more header byte
		}
		status, _ := e.get("/health").status, 0
		assert.Equal(t, http.StatusOK, status, "healthy under the sweep")
	}
	slow.Stop()
	wg.Wait()

	// The bystanders lost nothing and saw nothing twice or out of order.
	close(stop)
	bwg.Wait()
	wantMu.Lock()
	want = pushed
	wantMu.Unlock()
	select {
	case <-consumed:
	case <-time.After(20 * time.Second):
		t.Fatalf("the bystander consumer got %d of %d", len(got), pushed)
	}
	require.Len(t, got, pushed)
	for i, n := range got {
		require.Equal(t, i, n, "in order, once each")
	}
	t.Logf("bystanders: %d messages through the sweep", pushed)

	for _, c := range raw {
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return e.srv.Streams() == 0 }, 20*time.Second, 10*time.Millisecond,
		"every hostile stream is gone once its client is")
	u, _ := url.Parse(e.url + "/health")
	res, err := http.Get(u.String())
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
}
