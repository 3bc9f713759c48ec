package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
	"github.com/heraldmq/herald/poller"
)

// dlqItem is an element of GET /api/v1/dlq's messages.
type dlqItem struct {
	ID            string          `json:"dlqId"`
	MessageID     string          `json:"id"`
	Data          json.RawMessage `json:"data"`
	ErrorMessage  string          `json:"errorMessage"`
	ConsumerGroup string          `json:"consumerGroup"`
	Partition     string          `json:"partition"`
	TransactionID string          `json:"transactionId"`
}

// dlqList GETs the dead-letter listing and returns its items and total.
func dlqList(t *testing.T, e *env, query string) ([]dlqItem, int) {
	t.Helper()
	r := e.get("/api/v1/dlq?" + query)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var out struct {
		Messages []dlqItem
		Total    int
	}
	require.NoError(t, json.Unmarshal(r.body, &out))
	return out.Messages, out.Total
}

// deadLetterAll pops queue q for group g (batch n) and dead-letters the
// messages whose payload is in poison with error "boom <payload>",
// completing the others.
func deadLetterAll(t *testing.T, e *env, q, g string, n int, poison ...string) {
	t.Helper()
	res := e.pop(fmt.Sprintf("/api/v1/pop/queue/%s?consumerGroup=%s&batch=%d&wait=false", q, g, n))
	for _, m := range res.Messages {
		status := "completed"
		for _, p := range poison {
			if string(m.Data) == p {
				status = "dlq"
			}
		}
		a := e.ack(m, status, "boom "+string(m.Data))
		require.True(t, a.Success)
	}
}

// The listing's new filters and ids, one dead letter, replay by
// ids (the message comes back to its group alone, idempotently), by a
// bounded filter, purge, and the counters.
func TestDLQ_ReplayAndPurgeRoutes(t *testing.T) {
	e := newEnv(t)
	e.pushItems(`[{"queue":"orders","partition":"eu","payload":1},{"queue":"orders","partition":"eu","payload":2},
		{"queue":"orders","partition":"eu","payload":3},{"queue":"orders","partition":"us","payload":4}]`)
	deadLetterAll(t, e, "orders", "billing", 3, "2", "3")
	e.popEmpty("/api/v1/pop/queue/orders/partition/eu?consumerGroup=billing&wait=false")
	deadLetterAll(t, e, "orders", "ops", 3)

	items, total := dlqList(t, e, "queue=orders&error=BOOM%202")
	require.Equal(t, 1, total)
	two := items[0]
	assert.Regexp(t, `^[1-9][0-9]*$`, two.ID)
	assert.NotEqual(t, two.ID, two.MessageID)
	_, total = dlqList(t, e, "queue=orders&partition=us")
	assert.Equal(t, 0, total)
	_, total = dlqList(t, e, "queue=orders&partition=eu&consumerGroup=billing")
	assert.Equal(t, 2, total)

	r := e.get("/api/v1/dlq/" + two.ID)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var one dlqItem
	require.NoError(t, json.Unmarshal(r.body, &one))
	assert.Equal(t, two, one)
	assertError(t, e.get("/api/v1/dlq/987654"), http.StatusNotFound, "Dead letter not found")
	assert.Equal(t, http.StatusBadRequest, e.get("/api/v1/dlq/12x").status)

	r = e.post("/api/v1/dlq/replay", `{"ids":["`+two.ID+`","987654"]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"replayed":1,"skipped":{"not_found":1},"items":[{"id":"`+two.ID+`","status":"replayed","reason":null},
		{"id":"987654","status":"skipped","reason":"not_found"}]}`, string(r.body))
	assert.Equal(t, http.StatusNotFound, e.get("/api/v1/dlq/"+two.ID).status)
	// Back for billing alone, and only it; ops has nothing again.
	assert.Equal(t, []string{"2"}, datas(t, e, "/api/v1/pop/queue/orders/partition/eu?consumerGroup=billing&batch=10&wait=false"))
	assert.Nil(t, datas(t, e, "/api/v1/pop/queue/orders/partition/eu?consumerGroup=ops&batch=10&wait=false"))
	r = e.post("/api/v1/dlq/replay", `{"ids":["`+two.ID+`"]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"replayed":0,"skipped":{"not_found":1},"items":[{"id":"`+two.ID+`","status":"skipped","reason":"not_found"}]}`,
		string(r.body), "a second replay is a no-op")

	// Filter mode: billing still holds the lease on eu (message 2 is
	// unacked), so the other dead letter there is skipped as leased.
	r = e.post("/api/v1/dlq/replay", `{"filter":{"queue":"orders","consumerGroup":"billing"},"limit":10}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"replayed":0,"skipped":{"leased":1}}`, string(r.body))

	// Purge: twice, the second a no-op.
	items, _ = dlqList(t, e, "queue=orders")
	require.Len(t, items, 1)
	body := `{"ids":["` + items[0].ID + `"]}`
	r = e.post("/api/v1/dlq/purge", body)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"purged":1,"skipped":{},"items":[{"id":"`+items[0].ID+`","status":"purged","reason":null}]}`, string(r.body))
	r = e.post("/api/v1/dlq/purge", body)
	assert.JSONEq(t, `{"purged":0,"skipped":{"not_found":1},"items":[{"id":"`+items[0].ID+`","status":"skipped","reason":"not_found"}]}`,
		string(r.body))
	_, total = dlqList(t, e, "")
	assert.Equal(t, 0, total)

	m := string(e.get("/metrics").body)
	assert.Contains(t, m, `herald_dlq_replayed_total{queue="orders"} 1`)
	assert.Contains(t, m, `herald_dlq_purged_total{queue="orders"} 1`)
}

// A long-poll of the group waiting on the partition gets the
// replayed message at once (the replay wakes it, it is not left to the
// safety sweep, here slowed to a minute).
func TestDLQ_ReplayWakesAWaitingConsumer(t *testing.T) {
	e := newEnvPolling(t, func(c *poller.Config) { c.SweepMin, c.SweepMax = time.Minute, time.Minute })
	e.push("jobs", `"a"`, `"b"`)
	deadLetterAll(t, e, "jobs", "w", 2, `"a"`)
	items, _ := dlqList(t, e, "queue=jobs")
	require.Len(t, items, 1)

	got := make(chan []string, 1)
	go func() {
		r := e.get("/api/v1/pop/queue/jobs?consumerGroup=w&wait=true&timeout=20000")
		var res popResult
		_ = json.Unmarshal(r.body, &res)
		var out []string
		for _, m := range res.Messages {
			out = append(out, string(m.Data))
		}
		got <- out
	}()
	eventually(t, func() bool { return e.p.Intentions() == 1 }, "the long-poll never registered")
	start := time.Now()
	r := e.post("/api/v1/dlq/replay", `{"filter":{"queue":"jobs","error":"boom"}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"replayed":1,"skipped":{}}`, string(r.body))
	select {
	case msgs := <-got:
		assert.Equal(t, []string{`"a"`}, msgs)
		assert.Less(t, time.Since(start), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting long-poll did not get the replayed message")
	}
}

// Replay and purge are admin acts; a rights claim narrows an
// admin to the queues and partitions it may consume.
func TestDLQ_Roles(t *testing.T) {
	e := newAuthEnv(t)
	ro := auth.SignToken(authSecret, "r", "read-only", time.Hour)
	rw := auth.SignToken(authSecret, "w", "read-write", time.Hour)
	admin := auth.SignToken(authSecret, "a", "admin", time.Hour)
	narrow := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "n", "role": "admin",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"consume": []string{"mail/alice"}}})
	require.Equal(t, http.StatusCreated, e.doAuth(http.MethodPost, "/api/v1/push", rw,
		`{"items":[{"queue":"mail","partition":"bob","payload":1}]}`).status)
	r := e.doAuth(http.MethodGet, "/api/v1/pop/queue/mail?consumerGroup=g&wait=false", rw, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var res popResult
	require.NoError(t, json.Unmarshal(r.body, &res))
	ack, _ := json.Marshal(map[string]string{"transactionId": res.Messages[0].TransactionID, "partitionId": res.Messages[0].PartitionID,
		"leaseId": res.Messages[0].LeaseID, "status": "dlq", "consumerGroup": "g"})
	require.Equal(t, http.StatusOK, e.doAuth(http.MethodPost, "/api/v1/ack", rw, string(ack)).status)
	r = e.doAuth(http.MethodGet, "/api/v1/dlq?queue=mail", ro, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var list struct{ Messages []dlqItem }
	require.NoError(t, json.Unmarshal(r.body, &list))
	require.Len(t, list.Messages, 1)
	ids := `{"ids":["` + list.Messages[0].ID + `"]}`

	for _, c := range []struct {
		method, path, token, body string
		want                      int
	}{
		{"GET", "/api/v1/dlq/" + list.Messages[0].ID, ro, "", 200},
		{"GET", "/api/v1/dlq/" + list.Messages[0].ID, narrow, "", 404}, // another tenant's: as if it did not exist
		{"POST", "/api/v1/dlq/replay", ro, ids, 403},
		{"POST", "/api/v1/dlq/replay", rw, ids, 403},
		{"POST", "/api/v1/dlq/purge", rw, ids, 403},
		{"POST", "/api/v1/dlq/replay", "", ids, 401},
		{"POST", "/api/v1/dlq/replay", narrow, ids, 200}, // not_found, below
		{"POST", "/api/v1/dlq/purge", narrow, ids, 200},
		{"POST", "/api/v1/dlq/purge", narrow, `{"filter":{}}`, 403},
		{"POST", "/api/v1/dlq/purge", narrow, `{"filter":{"queue":"mail"}}`, 403},
		{"POST", "/api/v1/dlq/purge", narrow, `{"filter":{"queue":"mail","partition":"alice"}}`, 200},
	} {
		r := e.doAuth(c.method, c.path, c.token, c.body)
		assert.Equal(t, c.want, r.status, "%s %s %s: %s", c.method, c.path, c.body, r)
		if c.token == narrow && strings.Contains(c.body, "ids") {
			assert.Contains(t, string(r.body), `"reason":"not_found"`, "another tenant's id is not confirmed to exist")
		}
	}
	// Refused acts changed nothing; the admin's replay works.
	r = e.doAuth(http.MethodPost, "/api/v1/dlq/replay", admin, ids)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"replayed":1`)
}

// Bad replay and purge bodies are 400 with a clear message, and
// change nothing.
func TestDLQ_BadInput(t *testing.T) {
	e := newEnv(t)
	many := make([]string, 10001)
	for i := range many {
		many[i] = fmt.Sprintf(`"%d"`, i+1)
	}
	for _, c := range []struct{ name, body, msg string }{
		{"Empty", ``, "Empty request body"},
		{"NotJSON", `{`, ""},
		{"Neither", `{}`, "give ids (an array of dead-letter ids) or filter (an object)"},
		{"Both", `{"ids":["1"],"filter":{}}`, "give either ids or filter, not both"},
		{"UnknownField", `{"ids":["1"],"force":true}`, ""},
		{"UnknownFilterField", `{"filter":{"queue":"q","status":"x"}}`, ""},
		{"BadID", `{"ids":["12a"]}`, `bad id "12a": a dead letter's id is a positive integer`},
		{"ZeroID", `{"ids":["0"]}`, `bad id "0": a dead letter's id is a positive integer`},
		{"NumberID", `{"ids":[12]}`, "ids must be an array of dead-letter ids (strings)"},
		{"EmptyIDs", `{"ids":[]}`, "ids must hold 1 to 10000 ids"},
		{"TooManyIDs", `{"ids":[` + strings.Join(many, ",") + `]}`, "ids must hold 1 to 10000 ids"},
		{"LimitWithIDs", `{"ids":["1"],"limit":5}`, "limit goes with filter; ids name their dead letters"},
		{"LimitTooBig", `{"filter":{"queue":"q"},"limit":10001}`, "limit must be an integer between 1 and 10000"},
		{"LimitZero", `{"filter":{"queue":"q"},"limit":0}`, "limit must be an integer between 1 and 10000"},
		{"BadFrom", `{"filter":{"from":"yesterday"}}`, "filter.from must be an RFC3339 time"},
		{"FilterNotObject", `{"filter":"q"}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, path := range []string{"/api/v1/dlq/replay", "/api/v1/dlq/purge"} {
				r := e.post(path, c.body)
				if c.msg != "" {
					assertError(t, r, http.StatusBadRequest, c.msg)
				} else {
					assert.Equal(t, http.StatusBadRequest, r.status, "%s", r)
					assert.Contains(t, string(r.body), `"error"`)
				}
			}
		})
	}
}
