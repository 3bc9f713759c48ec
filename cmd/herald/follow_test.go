package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// followEvent is one message event of a follow stream.
type followEvent struct {
	id   string
	i, p int
}

// readFollow reads a follow stream's complete message events into out
// until the stream ends (an incomplete last event is dropped, as
// EventSource drops it).
func readFollow(ctx context.Context, t *testing.T, url, lastID string, out chan<- followEvent) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", res.StatusCode)
	}
	sc := bufio.NewScanner(res.Body)
	var ev followEvent
	var data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != "" && ev.id != "" {
				var m struct {
					Data struct{ I, P int } `json:"data"`
				}
				if json.Unmarshal([]byte(data), &m) == nil {
					ev.i, ev.p = m.Data.I, m.Data.P
					out <- ev
				}
			}
			ev, data = followEvent{}, ""
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		}
	}
	return sc.Err()
}

// A follower of instance A while producers push to instance B: A is
// killed (SIGKILL) mid-stream, the follower resumes on B with the id of
// its last complete event, and gets every message exactly once, each
// partition in order.
func TestFollow_ResumesExactlyOnAnotherInstanceAfterKill(t *testing.T) {
	bin := buildHerald(t)
	dsn := pgtest.DSN(t)
	a := startHerald(t, bin, dataDir(t), "--database-url", dsn)
	b := startHerald(t, bin, dataDir(t), "--database-url", dsn)
	const n, parts = 300, 4

	got := make(chan followEvent, 2*n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstDone := make(chan error, 1)
	go func() { firstDone <- readFollow(ctx, t, a.url+"api/v1/follow/queue/fk?from=beginning", "", got) }()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the producers' side, on B
		defer wg.Done()
		for i := range n {
			body := fmt.Sprintf(`{"items":[{"queue":"fk","partition":"p%d","payload":{"i":%d,"p":%d}}]}`, i%parts, i, i%parts)
			res, err := http.Post(b.url+"api/v1/push", "application/json", strings.NewReader(body))
			if !assert.NoError(t, err) {
				return
			}
			_ = res.Body.Close()
			assert.Equal(t, http.StatusCreated, res.StatusCode)
		}
	}()

	var seen []followEvent
	for len(seen) < n/4 {
		select {
		case ev := <-got:
			seen = append(seen, ev)
		case <-time.After(20 * time.Second):
			t.Fatalf("the follower on A got %d messages, then nothing", len(seen))
		}
	}
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case err := <-firstDone: // the stream of a killed instance ends in an error or EOF: either is its end
		t.Logf("the stream from the killed instance ended: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the stream from the killed instance did not end")
	}
	for drained := false; !drained; { // what A wrote before it died
		select {
		case ev := <-got:
			seen = append(seen, ev)
		default:
			drained = true
		}
	}
	last := seen[len(seen)-1].id
	t.Logf("A killed after %d events; resuming on B", len(seen))
	go func() { _ = readFollow(ctx, t, b.url+"api/v1/follow/queue/fk", last, got) }()
	for len(seen) < n {
		select {
		case ev := <-got:
			seen = append(seen, ev)
		case <-time.After(30 * time.Second):
			t.Fatalf("after the resume on B: %d of %d messages", len(seen), n)
		}
	}
	wg.Wait()
	select {
	case ev := <-got:
		t.Fatalf("a message more than pushed: %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
	once := map[int]bool{}
	lastIn := map[int]int{}
	for _, ev := range seen {
		require.False(t, once[ev.i], "message %d twice", ev.i)
		once[ev.i] = true
		if prev, ok := lastIn[ev.p]; ok {
			require.Greater(t, ev.i, prev, "partition %d in order", ev.p)
		}
		lastIn[ev.p] = ev.i
	}
	require.Len(t, once, n)
}
