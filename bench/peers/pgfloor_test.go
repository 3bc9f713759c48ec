package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/heraldmq/herald/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// servePGFloor serves the floor (pg-floor-async-ack's with asyncAck) on
// a database of the test's own and returns it and its base URL.
func servePGFloor(t *testing.T, asyncAck bool) (*pgFloorServer, string) {
	t.Helper()
	s, err := newPGFloorServer(t.Context(), pgtest.DSN(t), 4, asyncAck)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.handler())
	t.Cleanup(func() {
		hs.Close()
		s.close()
	})
	return s, hs.URL
}

// rowsOf counts queue q's rows in the floor's table.
func rowsOf(t *testing.T, s *pgFloorServer, q string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(t.Context(), `SELECT count(*) FROM messages WHERE queue = $1`, q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond every 10 ms until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPGFloor_DeliversEveryPushOnceInPartitionOrderAndDeletesAckedRows:
// pushes to 4 partitions at once, each partition's one after another,
// reach the consumer's socket each once, every partition's in the order
// pushed, and once the consumer has acked them the table holds none of
// them.
func TestPGFloor_DeliversEveryPushOnceInPartitionOrderAndDeletesAckedRows(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("asyncAck=%v", async), func(t *testing.T) { deliversInOrderAndDeletes(t, async) })
	}
}

func deliversInOrderAndDeletes(t *testing.T, asyncAck bool) {
	s, base := servePGFloor(t, asyncAck)
	ws, err := dialPGFloor(t.Context(), base, "q")
	if err != nil {
		t.Fatal(err)
	}
	type msg struct{ P, N int }
	var mu sync.Mutex
	var got []msg
	ids := map[int64]int{}
	consumed := make(chan error, 1)
	go func() {
		consumed <- consumePGFloor(ws, func(id int64, p []byte) {
			var m msg
			_ = json.Unmarshal(p, &m)
			mu.Lock()
			got = append(got, m)
			ids[id]++
			mu.Unlock()
		})
	}()
	const parts, each = 4, 25
	c := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, parts)
	for p := range parts {
		wg.Go(func() {
			for n := range each {
				if err := pushPGFloor(t.Context(), c, base, "q", fmt.Sprintf("p%d", p),
					fmt.Appendf(nil, `{"p":%d,"n":%d}`, p, n)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, "every message delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= parts*each
	})
	waitFor(t, "the acked rows deleted", func() bool { return rowsOf(t, s, "q") == 0 })
	// Its counters (the benchmark's statements per message) say as much.
	b, err := call(t.Context(), c, http.MethodGet, base+"/stats", nil, http.StatusOK, "reading the counters")
	if err != nil {
		t.Fatal(err)
	}
	var st pgFloorStats
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.Pushes != parts*each || st.Acked != parts*each || st.AckFrames < 1 || st.AckFrames > st.Frames ||
		st.Frames > parts*each {
		t.Errorf("counters %+v, want %d pushes and acks, 1 to frames ack frames, at most one frame a message", st, parts*each)
	}
	_ = ws.Close()
	<-consumed
	mu.Lock()
	defer mu.Unlock()
	if len(got) != parts*each || len(ids) != parts*each {
		t.Fatalf("%d messages with %d distinct ids delivered, want %d each", len(got), len(ids), parts*each)
	}
	next := make([]int, parts)
	for _, m := range got {
		if m.P < 0 || m.P >= parts || m.N != next[m.P] {
			t.Fatalf("partition p%d: message %d delivered where %d was due; all: %v", m.P, m.N, next[max(0, min(m.P, parts-1))], got)
		}
		next[m.P]++
	}
}

// TestPGFloor_PushIsCommittedBeforeItsAnswer: when the push is answered
// its row is in the table (here, with no consumer, it stays there).
func TestPGFloor_PushIsCommittedBeforeItsAnswer(t *testing.T) {
	s, base := servePGFloor(t, false)
	if err := pushPGFloor(t.Context(), http.DefaultClient, base, "nobody", "p0", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	var p []byte
	if err := s.pool.QueryRow(t.Context(), `SELECT payload FROM messages WHERE queue = 'nobody' AND partition = 'p0'`).
		Scan(&p); err != nil {
		t.Fatalf("the pushed row: %v", err)
	}
	if string(p) != `{"x":1}` {
		t.Fatalf("the row's payload is %q", p)
	}
}

// TestPGFloor_RefusesAPushOfOtherThanOneItem: a body that is not JSON, of
// two items, or of one without a queue or a payload is answered 400 and
// stores nothing.
func TestPGFloor_RefusesAPushOfOtherThanOneItem(t *testing.T) {
	s, base := servePGFloor(t, false)
	for _, body := range []string{
		`not json`,
		`{"items":[]}`,
		`{"items":[{"queue":"bad","partition":"p0","payload":1},{"queue":"bad","partition":"p0","payload":2}]}`,
		`{"items":[{"partition":"p0","payload":1}]}`,
		`{"items":[{"queue":"bad","partition":"p0"}]}`,
	} {
		b, err := call(t.Context(), http.DefaultClient, http.MethodPost, base+"/push", []byte(body), http.StatusBadRequest, body)
		if err != nil {
			t.Errorf("%s: %v", body, err)
		} else if len(b) == 0 {
			t.Errorf("%s: a 400 without a reason", body)
		}
	}
	if n := rowsOf(t, s, "bad"); n != 0 {
		t.Fatalf("refused pushes stored %d rows", n)
	}
}

// TestPGFloor_ClosesASocketThatSendsOtherThanAnAckFrame: an ack frame is
// 8-byte ids; a frame cut short, an empty one or a text frame closes the
// socket with 1003.
func TestPGFloor_ClosesASocketThatSendsOtherThanAnAckFrame(t *testing.T) {
	_, base := servePGFloor(t, false)
	for i, f := range []struct {
		kind int
		data []byte
	}{{websocket.BinaryMessage, []byte{0, 0, 0, 0, 1}}, {websocket.BinaryMessage, nil},
		{websocket.TextMessage, []byte("12345678")}} {
		ws, err := dialPGFloor(t.Context(), base, fmt.Sprintf("bad-ack-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := ws.WriteMessage(f.kind, f.data); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _, err = ws.ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseUnsupportedData {
			t.Errorf("frame %d (%q): read %v, want close 1003", i, f.data, err)
		}
		_ = ws.Close()
	}
}

// TestPGFloor_RefusesASecondConsumerOfAQueue: a queue has one consumer; a
// second socket for it is answered 409 while the first is open.
func TestPGFloor_RefusesASecondConsumerOfAQueue(t *testing.T) {
	_, base := servePGFloor(t, false)
	ws, err := dialPGFloor(t.Context(), base, "one")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ws.Close() }()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, res, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(base, "http")+"/ws/one", nil)
	if err == nil || res == nil || res.StatusCode != http.StatusConflict {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		t.Fatalf("a second consumer: %v, status %d, want 409", err, status)
	}
	_ = res.Body.Close()
}

// TestPGFloor_CommitsPushesSynchronouslyAndAcksAsAsked: the pushes'
// connections commit synchronously whatever the cluster's default (the
// test cluster's is off); the acks' too, but for pg-floor-async-ack's.
func TestPGFloor_CommitsPushesSynchronouslyAndAcksAsAsked(t *testing.T) {
	show := func(p interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var v string
		if err := p.QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, async := range []bool{false, true} {
		s, _ := servePGFloor(t, async)
		want := "on"
		if async {
			want = "off"
		}
		if p, a := show(s.pool), show(s.ackPool); p != "on" || a != want {
			t.Errorf("asyncAck %v: synchronous_commit %s for pushes, %s for acks; want on, %s", async, p, a, want)
		}
	}
}
