package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// dialSubscribed opens a WebSocket on base subscribed to queue and reads
// its subscribed frame.
func dialSubscribed(t *testing.T, base, queue string) *websocket.Conn {
	t.Helper()
	ws, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}, HandshakeTimeout: 10 * time.Second}).
		Dial("ws"+strings.TrimPrefix(base, "http")+"api/v1/ws", nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	t.Cleanup(func() { _ = ws.Close() })
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","id":1,"queue":"`+queue+`"}`)))
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, frame, err := ws.ReadMessage()
	require.NoError(t, err)
	require.Contains(t, string(frame), `"subscribed"`)
	return ws
}

// nextDeliver reads frames until a delivery, within d.
func nextDeliver(ws *websocket.Conn, d time.Duration) (string, error) {
	_ = ws.SetReadDeadline(time.Now().Add(d))
	for {
		_, frame, err := ws.ReadMessage()
		if err != nil {
			return "", err
		}
		if strings.Contains(string(frame), `"deliver"`) {
			return string(frame), nil
		}
	}
}

// An instance killed with -9 leaves the lease of a delivered, unacked
// message behind (300 s by default). Restarted with the same instance id,
// it gives that lease back before serving: a consumer waiting on another
// instance receives the message at once, not after the lease time, and
// the release counts no attempt.
func TestStart_ReleasesLeasesOfThePreviousLife(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	a := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--instance-id", "life")
	other := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--instance-id", "other")

	held := dialSubscribed(t, a.url, "lives")
	pushOne(t, a.url, "lives", `{"n":1}`)
	frame, err := nextDeliver(held, 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, frame, `"n":1`)
	waiting := dialSubscribed(t, other.url, "lives")

	require.NoError(t, a.cmd.Process.Kill()) // no drain, no release
	t.Logf("the killed instance exited: %v", <-a.done)
	code, body := get(t, other.url+"api/v1/pop/queue/lives?wait=false")
	require.Equal(t, http.StatusNoContent, code, "the lease of the killed instance still holds the message: %s", body)

	restarted := time.Now()
	b := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--instance-id", "life")
	frame, err = nextDeliver(waiting, 20*time.Second)
	require.NoError(t, err, "the message is delivered again once the instance restarted")
	t.Logf("delivered on the other instance %v after the restart began", time.Since(restarted))
	assert.Contains(t, frame, `"n":1`)
	var d struct {
		Messages []struct {
			RetryCount int `json:"retryCount"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(frame), &d), frame)
	require.Len(t, d.Messages, 1, frame)
	assert.Zero(t, d.Messages[0].RetryCount, "a crash of the gateway is not the consumer's failure")
	assert.True(t, strings.Contains(strings.Join(b.logged(), "\n"), "released the leases of this instance's previous life"))
}

// Two live instances with one instance id would give back each other's
// leases at every start: the second is refused, and says why.
func TestStart_RefusesAnInstanceIdInUse(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	startHerald(t, bin, dataDir(t), "--database-url", dsn, "--instance-id", "twin")

	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir(t), "--database-url", dsn, "--instance-id", "twin")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 1000)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		exited <- cmd.Wait()
	}()
	var seen []string
	var exit error
	timeout := time.After(time.Minute)
wait:
	for {
		select {
		case l := <-lines:
			seen = append(seen, l)
			require.NotContains(t, l, "herald is serving", "a second instance with the id in use serves")
		case exit = <-exited:
			break wait
		case <-timeout:
			t.Fatal("the twin neither served nor exited within a minute")
		}
	}
	for len(lines) > 0 {
		seen = append(seen, <-lines)
	}
	log := strings.Join(seen, "\n")
	require.Error(t, exit, "the twin exits: %s", log)
	assert.Equal(t, 1, cmd.ProcessState.ExitCode(), log)
	assert.Contains(t, log, "instance id")
}

// Many subscriptions naming a partition each hold their messages when the
// instance is killed; restarted with the same id, it serves every one of
// them its message again, soon (the figure, 9,000 within 5 s, is
// herald-bench restart's; the ceiling here only says "not the lease time").
func TestStart_RedeliversToEveryPartitionSubscription(t *testing.T) {
	const parts, perSocket = 300, 100
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	a := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--instance-id", "many")
	items := make([]string, parts)
	for i := range items {
		items[i] = fmt.Sprintf(`{"queue":"many","partition":"p%d","payload":{"p":%d}}`, i, i)
	}
	res, err := http.Post(a.url+"api/v1/push", "application/json", strings.NewReader(`{"items":[`+strings.Join(items, ",")+`]}`))
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)

	// subscribeAll opens the sockets on base and returns the partitions
	// delivered, as they come.
	subscribeAll := func(base string) <-chan string {
		got := make(chan string, parts)
		for lo := 0; lo < parts; lo += perSocket {
			ws, res, err := (&websocket.Dialer{Subprotocols: []string{"herald.v1"}, HandshakeTimeout: 10 * time.Second}).
				Dial("ws"+strings.TrimPrefix(base, "http")+"api/v1/ws", nil)
			require.NoError(t, err)
			_ = res.Body.Close()
			t.Cleanup(func() { _ = ws.Close() })
			for i := lo; i < lo+perSocket; i++ {
				require.NoError(t, ws.WriteMessage(websocket.TextMessage,
					[]byte(fmt.Sprintf(`{"type":"subscribe","id":%d,"queue":"many","partition":"p%d","maxInFlight":1}`, i, i))))
			}
			go func() {
				for {
					_, frame, err := ws.ReadMessage()
					if err != nil {
						return
					}
					var f struct {
						Type     string `json:"type"`
						Messages []struct {
							Partition string `json:"partition"`
						} `json:"messages"`
					}
					if json.Unmarshal(frame, &f) == nil && f.Type == "deliver" {
						for _, m := range f.Messages {
							got <- m.Partition
						}
					}
				}
			}()
		}
		return got
	}
	// every waits until each partition was delivered once.
	every := func(got <-chan string, within time.Duration) map[string]bool {
		seen := map[string]bool{}
		deadline := time.After(within)
		for len(seen) < parts {
			select {
			case p := <-got:
				seen[p] = true
			case <-deadline:
				return seen
			}
		}
		return seen
	}
	require.Len(t, every(subscribeAll(a.url), time.Minute), parts, "every subscription got its message")

	require.NoError(t, a.cmd.Process.Kill())
	t.Logf("the killed instance exited: %v", <-a.done)
	b := startHerald(t, bin, dataDir(t), "--database-url", dsn, "--instance-id", "many")
	start := time.Now()
	seen := every(subscribeAll(b.url), time.Minute)
	t.Logf("%d of %d partition subscriptions served again in %v", len(seen), parts, time.Since(start))
	assert.Len(t, seen, parts, "every subscription gets its message again after the restart")
}
