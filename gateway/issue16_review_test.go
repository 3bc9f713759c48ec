package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 16 review: on a queue with windowBuffer, partitions pushed to more
// often than the window filled the pre-flight's range, so a partition past
// its window behind them was never offered to a waiting consumer while the
// pushes went on (an HTTP pop without wait found it). A long-poll must get
// it within its timeout.
func TestIssue16_WindowedPartitionsDoNotStarveAQuietOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"winq","options":{"windowBuffer":1}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	// busy-a and busy-b come first in the index (created first).
	e.pushItems(`[{"queue":"winq","partition":"busy-a","payload":{"n":0}},{"queue":"winq","partition":"busy-b","payload":{"n":0}}]`)
	e.pushItems(`[{"queue":"winq","partition":"quiet","payload":{"quiet":true}}]`)

	stop := make(chan struct{})
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		tick := time.NewTicker(150 * time.Millisecond) // well inside the 1 s window
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			e.pushItems(fmt.Sprintf(`[{"queue":"winq","partition":"busy-a","payload":{"n":%d}},{"queue":"winq","partition":"busy-b","payload":{"n":%d}}]`, n, n))
		}
	}()
	defer func() { close(stop); <-pushed }()

	// The quiet partition's window ends 1 s after its push; the busy ones'
	// never do while the pushes go on.
	got := e.get("/api/v1/pop/queue/winq?wait=true&timeout=6000&consumerGroup=g")
	require.Equal(t, http.StatusOK, got.status, "the quiet partition was not delivered while the others were pushed to: %s", got)
	var body struct {
		Messages []struct {
			Partition string          `json:"partition"`
			Data      json.RawMessage `json:"data"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(got.body, &body))
	require.NotEmpty(t, body.Messages)
	assert.Equal(t, "quiet", body.Messages[0].Partition)
}

// Review of issue 16: a WebSocket frame's own fields were read without
// regard to case ({"TYPE":"ack","ITEMS":[…]} acked), while push and ack
// items match exactly. A frame naming a field in other case is refused
// with a bad_request naming it; unknown fields are still ignored.
func TestIssue16_WSFrameFieldNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	for _, frame := range []string{
		`{"TYPE":"ping","id":1}`,
		`{"type":"ping","ID":1}`,
		`{"type":"subscribe","Queue":"wsc","id":1}`,
	} {
		c.send(frame)
		f := c.next("error")
		assert.JSONEq(t, `"bad_request"`, string(f["code"]), frame)
		assert.Contains(t, string(f["message"]), "case-sensitive", frame)
	}
	c.send(`{"type":"ping","id":2,"extra":true}`)
	f := c.next("pong")
	assert.JSONEq(t, `2`, string(f["id"]))
}
