package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wsDelivery is one message of a deliver frame.
type wsDelivery struct {
	TransactionID string `json:"transactionId"`
	PartitionID   string `json:"partitionId"`
	LeaseID       string `json:"leaseId"`
	RetryCount    int    `json:"retryCount"`
	Data          struct {
		N string `json:"n"`
	} `json:"data"`
}

// The database changes under the instance and has lost what the old one
// committed last (a failover to an asynchronous standby; the consumer rows
// are put back as the old primary had streamed them): on partition a the
// ack of a1, answered success, so its lease is back with nobody holding
// a1; on partition b the pop of b1, so the subscription holds b1 (its one
// credit) under a lease the database never had. Once the instance sees the
// database changed (here told directly; queue's
// TestInstanceLock_TellsWhenTakenAgainOnAnotherDatabase covers how it sees
// it), both partitions are served again within seconds, charging nothing:
// a1 and b1 come again with retryCount 0 and a2 and b2 follow. Before, a
// waited out the lease time (5 min) and b its stream's lease check (30 s).
func TestReconcile_LeasesTheDatabaseLostAreSettledWithinSeconds(t *testing.T) {
	s, err := New(context.Background(), testConfig(t))
	require.NoError(t, err)
	stop := run(t, s)
	defer func() { assert.NoError(t, stop()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	push := func(part, n string) {
		t.Helper()
		res, err := http.Post(s.URL()+"/api/v1/push", "application/json", strings.NewReader(fmt.Sprintf(
			`{"items":[{"queue":"rc","partition":%q,"payload":{"n":%q}}]}`, part, n)))
		require.NoError(t, err)
		_ = res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode)
	}
	row := func(part string) string {
		t.Helper()
		var snap string
		require.NoError(t, s.Store().Pool().QueryRow(ctx, `SELECT to_jsonb(c)::text FROM consumers c
			JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
			WHERE q.name = 'rc' AND p.name = $1`, part).Scan(&snap))
		return snap
	}
	restore := func(snap string) {
		t.Helper()
		_, err := s.Store().Pool().Exec(ctx, `UPDATE consumers c SET (cursor, done, lease_id, lease_owner,
			lease_expires_at, lease_from, lease_to, leased_at, attempts, attempt_seq, delivered_to) = (r.cursor, r.done,
			r.lease_id, r.lease_owner, r.lease_expires_at, r.lease_from, r.lease_to, r.leased_at, r.attempts,
			r.attempt_seq, r.delivered_to)
			FROM jsonb_populate_record(NULL::consumers, $1::jsonb) r
			WHERE c.partition_id = r.partition_id AND c.consumer_group = r.consumer_group`, snap)
		require.NoError(t, err)
	}

	push("a", "a1")
	push("b", "b1")
	ws, res, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(s.URL(), "http")+"/api/v1/ws", nil)
	require.NoError(t, err)
	_ = res.Body.Close()
	defer func() { _ = ws.Close() }()
	delivered := make(chan wsDelivery, 16)
	acked := make(chan bool, 16)
	go func() {
		for {
			var f struct {
				Type     string          `json:"type"`
				Messages []wsDelivery    `json:"messages"`
				Results  json.RawMessage `json:"results"`
			}
			if ws.ReadJSON(&f) != nil {
				return
			}
			switch f.Type {
			case "deliver":
				for _, m := range f.Messages {
					delivered <- m
				}
			case "ack_result":
				acked <- strings.Contains(string(f.Results), `"success":true`)
			}
		}
	}()
	next := func(what string) wsDelivery {
		t.Helper()
		select {
		case m := <-delivered:
			return m
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no delivery within 5 s", what)
			return wsDelivery{}
		}
	}
	ack := func(m wsDelivery) {
		t.Helper()
		require.NoError(t, ws.WriteJSON(map[string]any{"type": "ack", "id": "a", "items": []map[string]string{{
			"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": m.LeaseID, "status": "completed"}}}))
		select {
		case ok := <-acked:
			require.True(t, ok, "ack of %s", m.Data.N)
		case <-time.After(5 * time.Second):
			t.Fatalf("ack of %s: no answer within 5 s", m.Data.N)
		}
	}

	// Partition a: the lease a1 came under, back after its ack.
	require.NoError(t, ws.WriteJSON(map[string]any{"type": "subscribe", "id": "sa", "queue": "rc", "partition": "a",
		"batch": 1, "maxInFlight": 1}))
	a1 := next("a1")
	require.Equal(t, "a1", a1.Data.N)
	streamed := row("a")
	ack(a1)
	restore(streamed)
	push("a", "a2")

	// Partition b: the pop of b1, gone.
	before := row("b")
	require.NoError(t, ws.WriteJSON(map[string]any{"type": "subscribe", "id": "sb", "queue": "rc", "partition": "b",
		"batch": 1, "maxInFlight": 1}))
	b1 := next("b1")
	require.Equal(t, "b1", b1.Data.N)
	restore(before)
	push("b", "b2")

	s.databaseChanged()
	got := map[string]wsDelivery{}
	for len(got) < 2 {
		m := next("after the database changed")
		got[m.Data.N] = m
		assert.Zero(t, m.RetryCount, "%s: no attempt charged", m.Data.N)
		ack(m)
	}
	assert.Contains(t, got, "a1", "a1 again: its ack is gone with the old database")
	assert.Contains(t, got, "b1", "b1 again: its pop is gone with the old database")
	for len(got) < 4 {
		m := next("a2, b2")
		got[m.Data.N] = m
		assert.Zero(t, m.RetryCount, "%s: no attempt charged", m.Data.N)
		ack(m)
	}
	assert.Contains(t, got, "a2")
	assert.Contains(t, got, "b2")
}
