package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
)

// unavailableOnce is a server end of the WebSocket protocol whose database
// is away for the first ack: it answers it with the "unavailable" error
// frame a Herald sends then, and the acks after it with success. It
// delivers one message on subscribe.
type unavailableOnce struct {
	mu   sync.Mutex
	acks []time.Time // when each ack frame arrived
}

func (u *unavailableOnce) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	up := websocket.Upgrader{Subprotocols: []string{client.Subprotocol}}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer func() { _ = ws.Close() }()
	for {
		var f struct {
			Type string          `json:"type"`
			ID   json.RawMessage `json:"id"`
		}
		if ws.ReadJSON(&f) != nil {
			return
		}
		switch f.Type {
		case "subscribe":
			_ = ws.WriteJSON(map[string]any{"type": "subscribed", "id": f.ID, "sub": "s1"})
			_ = ws.WriteJSON(map[string]any{"type": "deliver", "sub": "s1", "messages": []map[string]any{{
				"transactionId": "t1", "partitionId": "p1", "leaseId": "l1", "queue": "q", "partition": "Default",
				"data": map[string]any{"n": 1}, "offset": 1}}})
		case "ack":
			u.mu.Lock()
			u.acks = append(u.acks, time.Now())
			first := len(u.acks) == 1
			u.mu.Unlock()
			if first {
				_ = ws.WriteJSON(map[string]any{"type": "error", "id": f.ID, "code": "unavailable",
					"message": "database unavailable: try again shortly", "retryAfter": 2})
				continue
			}
			_ = ws.WriteJSON(map[string]any{"type": "ack_result", "id": f.ID, "results": []map[string]any{{
				"index": 0, "success": true, "error": nil, "transactionId": "t1"}}})
		case "unsubscribe":
			_ = ws.WriteJSON(map[string]any{"type": "unsubscribed", "id": f.ID})
		}
	}
}

func (u *unavailableOnce) ackFrames() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Time(nil), u.acks...)
}

// An ack the server could not apply because its database was away is sent
// again after a back-off, by Message.Ack and by the automatic acks of a
// handler that returned nil, instead of leaving the message leased until
// its lease expires.
func TestAck_UnavailableIsSentAgain(t *testing.T) {
	for _, manual := range []bool{true, false} {
		t.Run(map[bool]string{true: "Manual", false: "Automatic"}[manual], func(t *testing.T) {
			srv := &unavailableOnce{}
			hs := httptest.NewServer(srv)
			defer hs.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, hs.URL, client.Options{})
			require.NoError(t, err)
			defer func() { _ = c.Close() }()

			acked := make(chan error, 1)
			sctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- c.Subscribe(sctx, client.SubscribeOptions{Queue: "q", ManualAck: manual},
					func(ctx context.Context, m *client.Message) error {
						if manual {
							acked <- m.Ack(ctx)
						}
						return nil
					})
			}()
			if manual {
				select {
				case err := <-acked:
					assert.NoError(t, err, "the second attempt succeeded")
				case <-ctx.Done():
					t.Fatal("Ack did not return")
				}
			}
			require.Eventually(t, func() bool { return len(srv.ackFrames()) >= 2 }, 10*time.Second, 10*time.Millisecond,
				"the ack was sent again")
			frames := srv.ackFrames()
			assert.GreaterOrEqual(t, frames[1].Sub(frames[0]), 90*time.Millisecond, "after a back-off")
			stop()
			require.NoError(t, <-done)
			assert.Len(t, srv.ackFrames(), 2, "not again once answered")
		})
	}
}
