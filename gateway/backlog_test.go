package gateway_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
)

// backlogAnswer is GET /api/v1/status/backlog's answer.
type backlogAnswer struct {
	SampledAt string `json:"sampledAt"`
	Top       int    `json:"top"`
	Groups    []struct {
		Queue                   string   `json:"queue"`
		Group                   string   `json:"group"`
		Lag                     int64    `json:"lag"`
		LagPartitions           int64    `json:"lagPartitions"`
		OldestPendingAgeSeconds *float64 `json:"oldestPendingAgeSeconds"`
		DeadLetters             int64    `json:"deadLetters"`
	} `json:"groups"`
}

func getBacklog(t *testing.T, e *env) backlogAnswer {
	t.Helper()
	r := e.get("/api/v1/status/backlog")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var out backlogAnswer
	require.NoError(t, json.Unmarshal(r.body, &out), "%s", r)
	return out
}

// The backlog route answers per (queue, group) the lag, the
// partitions lagging, the oldest pending age and the dead letters: from a
// read of its own before the hygiene loop's first sample, then from the
// latest sample (a change shows only once a sample is taken).
func TestBacklog_Route(t *testing.T) {
	e := newEnv(t)
	e.pushItems(`[{"queue":"orders","partition":"eu","payload":1},{"queue":"orders","partition":"eu","payload":2},
		{"queue":"orders","partition":"us","payload":3}]`)
	// billing finishes everything, dead-lettering 2 (one pop per partition).
	deadLetterAll(t, e, "orders", "billing", 3, "2")
	deadLetterAll(t, e, "orders", "billing", 3, "2")
	e.popEmpty("/api/v1/pop/queue/orders?consumerGroup=billing&wait=false")
	// ops finishes 1 and leaves 2 (eu and us); us's was pushed 10 minutes ago.
	res := e.pop("/api/v1/pop/queue/orders/partition/eu?consumerGroup=ops&batch=1&wait=false")
	require.Len(t, res.Messages, 1)
	require.True(t, e.ack(res.Messages[0], "completed", "").Success)
	e.exec(`UPDATE messages SET created_at = now() - interval '10 minutes'
		WHERE partition_id = (SELECT id FROM partitions WHERE name = 'us')`)

	before := time.Now()
	b := getBacklog(t, e)
	at, err := time.Parse(time.RFC3339Nano, b.SampledAt)
	require.NoError(t, err)
	assert.WithinDuration(t, before, at, 5*time.Second)
	assert.Equal(t, 100, b.Top)
	require.Len(t, b.Groups, 2, "%+v", b.Groups)
	ops, billing := b.Groups[0], b.Groups[1]
	assert.Equal(t, []string{"orders", "ops"}, []string{ops.Queue, ops.Group}, "the most waiting first")
	assert.EqualValues(t, 2, ops.Lag)
	assert.EqualValues(t, 2, ops.LagPartitions)
	if assert.NotNil(t, ops.OldestPendingAgeSeconds) {
		assert.InDelta(t, 600, *ops.OldestPendingAgeSeconds, 60)
	}
	assert.Zero(t, ops.DeadLetters)
	assert.Equal(t, []string{"orders", "billing"}, []string{billing.Queue, billing.Group})
	assert.Zero(t, billing.Lag)
	assert.Nil(t, billing.OldestPendingAgeSeconds, "nothing waits: null")
	assert.EqualValues(t, 1, billing.DeadLetters)

	// ops catches up: the answer keeps the sample until the next one.
	deadLetterAll(t, e, "orders", "ops", 3)
	deadLetterAll(t, e, "orders", "ops", 3)
	again := getBacklog(t, e)
	assert.Equal(t, b, again, "no query per request")
	_, err = e.store.SampleHygiene(ctxT(t))
	require.NoError(t, err)
	after := getBacklog(t, e)
	assert.NotEqual(t, b.SampledAt, after.SampledAt)
	require.Len(t, after.Groups, 1, "%+v", after.Groups)
	assert.Equal(t, "billing", after.Groups[0].Group)
}

// The backlog route is the admin's.
func TestBacklog_IsTheAdminsOnly(t *testing.T) {
	e := newAuthEnv(t)
	for _, c := range []struct {
		token string
		want  int
	}{
		{auth.SignToken(authSecret, "r", "read-only", time.Hour), http.StatusForbidden},
		{auth.SignToken(authSecret, "w", "read-write", time.Hour), http.StatusForbidden},
		{"", http.StatusUnauthorized},
		{auth.SignToken(authSecret, "a", "admin", time.Hour), http.StatusOK},
	} {
		r := e.doAuth(http.MethodGet, "/api/v1/status/backlog", c.token, "")
		assert.Equal(t, c.want, r.status, "%s", r)
	}
}
