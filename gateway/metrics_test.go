package gateway_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/gateway"
)

// seriesRE is one sample line of the Prometheus text format.
var seriesRE = regexp.MustCompile(`^(\w+)\{(.*)\} (\S+)$`)

// scrape reads /metrics and returns, per metric name, its samples' label
// strings with their values.
func scrape(t *testing.T, e *env) (string, map[string]map[string]float64) {
	t.Helper()
	r := e.get("/metrics")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	out := map[string]map[string]float64{}
	for _, line := range strings.Split(string(r.body), "\n") {
		m := seriesRE.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(m[1], "herald_") {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(t, err, line)
		if out[m[1]] == nil {
			out[m[1]] = map[string]float64{}
		}
		out[m[1]][m[2]] = v
	}
	return string(r.body), out
}

// Every queue and every consumer group name became a label value,
// so 20,000 queues made /metrics 3 MB, and any consumer could add series by
// popping under invented group names. By default the first 100 queues get
// their own label value and the rest share "__other__"; group names are no
// label values at all; nor are invented HTTP methods.
func TestMetrics_CardinalityIsBounded(t *testing.T) {
	t.Parallel()
	const queues, limit = 500, 100
	e := newEnv(t)
	items := make([]string, queues)
	for i := range items {
		items[i] = fmt.Sprintf(`{"queue":"h8-q-%d","payload":%d}`, i, i)
	}
	e.pushItems("[" + strings.Join(items, ",") + "]")
	for i := range queues {
		got := e.pop(fmt.Sprintf("/api/v1/pop/queue/h8-q-%d?consumerGroup=invented-group-%d&wait=false", i, i))
		require.Len(t, got.Messages, 1)
		require.True(t, e.ack(got.Messages[0], "completed", "").Success)
	}
	for i := range 20 {
		e.do(fmt.Sprintf("INVENTED%d", i), "/", "")
	}

	body, series := scrape(t, e)
	assert.NotContains(t, body, "invented-group-")
	assert.NotContains(t, body, "INVENTED")
	queueRE := regexp.MustCompile(`queue="([^"]*)"`)
	labelled := 0
	for name, samples := range series {
		if !strings.Contains(fmt.Sprint(samples), `queue="`) {
			continue
		}
		labelled++
		names := map[string]bool{}
		for labels := range samples {
			if m := queueRE.FindStringSubmatch(labels); m != nil {
				names[m[1]] = true
			}
		}
		assert.LessOrEqual(t, len(samples), limit+1, "%s has %d series", name, len(samples))
		assert.LessOrEqual(t, len(names), limit+1, "%s names %d queues", name, len(names))
		assert.True(t, names["__other__"], "%s has no __other__ bucket", name)
	}
	assert.GreaterOrEqual(t, labelled, 3, "pushed, popped and acks carry a queue label")
	// Nothing is lost in the bucket: the series still add up.
	sum := func(name string) (n float64) {
		for _, v := range series[name] {
			n += v
		}
		return n
	}
	assert.Equal(t, float64(queues), sum("herald_messages_pushed_total"))
	assert.Equal(t, float64(queues), sum("herald_messages_popped_total"))
	assert.Equal(t, float64(queues), sum("herald_acks_total"))
	assert.Equal(t, float64(queues-limit), series["herald_messages_pushed_total"][`queue="__other__"`])
}

// /metrics named every queue and group without a token when auth
// was on. With Config.Metrics.Auth (--metrics-auth) it takes an admin
// token; without it, it stays open as before. /health is always open.
func TestMetrics_AuthTakesAnAdminToken(t *testing.T) {
	t.Parallel()
	reader := auth.SignToken(authSecret, "reader", "read-only", time.Hour)
	writer := auth.SignToken(authSecret, "writer", "read-write", time.Hour)
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)

	guarded := newEnv(t, func(c *gateway.Config) {
		c.Auth = &auth.Auth{Secret: authSecret}
		c.Metrics.Auth = true
	})
	for _, tc := range []struct {
		token  string
		status int
	}{{"", http.StatusUnauthorized}, {"a.b.c", http.StatusUnauthorized}, {reader, http.StatusForbidden},
		{writer, http.StatusForbidden}, {admin, http.StatusOK}} {
		r := guarded.doAuth(http.MethodGet, "/metrics", tc.token, "")
		assert.Equal(t, tc.status, r.status, "token %q: %s", tc.token, r)
		if tc.status == http.StatusOK {
			assert.Contains(t, string(r.body), "herald_http_requests_total")
		} else {
			assert.NotContains(t, string(r.body), "herald_")
		}
	}
	assert.Equal(t, http.StatusOK, guarded.doAuth(http.MethodGet, "/health", "", "").status)

	// Without Metrics.Auth: open, with or without auth, as before.
	open := newAuthEnv(t)
	assert.Equal(t, http.StatusOK, open.doAuth(http.MethodGet, "/metrics", "", "").status)
	assert.Equal(t, http.StatusOK, open.doAuth(http.MethodGet, "/metrics", reader, "").status)
	// Metrics.Auth without auth has nothing to check tokens with: open.
	noAuth := newEnv(t, func(c *gateway.Config) { c.Metrics.Auth = true })
	assert.Equal(t, http.StatusOK, noAuth.doAuth(http.MethodGet, "/metrics", "", "").status)
}

// The bounds are configurable: no queue labels at all (--metrics-max-queues
// 0), and group names as labels when asked (--metrics-group-labels), as
// bounded as the queues.
func TestMetrics_LabelOptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *gateway.Config) {
		c.Metrics.Queues = gateway.NewLabelLimiter(0)
	})
	e.push("h8-a", `1`)
	e.push("h8-b", `2`)
	_, series := scrape(t, e)
	assert.Equal(t, map[string]float64{`queue="__other__"`: 2}, series["herald_messages_pushed_total"])

	g := newEnv(t, func(c *gateway.Config) {
		c.Metrics.Queues = gateway.NewLabelLimiter(2)
		c.Metrics.GroupLabels = true
	})
	for i := range 4 {
		g.push(fmt.Sprintf("h8-g%d", i), `1`)
		got := g.pop(fmt.Sprintf("/api/v1/pop/queue/h8-g%d?consumerGroup=grp-%d&wait=false", i, i))
		require.Len(t, got.Messages, 1)
	}
	got := g.pop("/api/v1/pop/queue/h8-g0?wait=false")
	require.Len(t, got.Messages, 1)
	_, series = scrape(t, g)
	assert.Equal(t, map[string]float64{
		`group="grp-0",queue="h8-g0"`: 1, `group="grp-1",queue="h8-g1"`: 1,
		`group="__other__",queue="__other__"`: 2, `group="__QUEUE_MODE__",queue="h8-g0"`: 1,
	}, series["herald_messages_popped_total"])
}

func TestMetrics_LabelLimiterConcurrent(t *testing.T) {
	t.Parallel()
	l := gateway.NewLabelLimiter(50)
	named := make(chan string, 16*200)
	done := make(chan struct{})
	for w := range 16 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				named <- l.Value(fmt.Sprintf("q%d", (w*7+i)%300))
			}
		}()
	}
	for range 16 {
		<-done
	}
	close(named)
	distinct := map[string]bool{}
	for v := range named {
		distinct[v] = true
	}
	assert.Len(t, distinct, 51, "50 names and __other__")
	assert.True(t, distinct[gateway.OtherLabel])
	assert.Equal(t, gateway.OtherLabel, l.Value("never-seen"))
	for v := range distinct {
		assert.Equal(t, v, l.Value(v), "a named value stays named")
	}
}

// A queue with dlqAfterMaxRetries false drops a message nacked past its
// retry limit: the ack answers dlq false, no dead letter is listed, and
// herald_messages_dropped_total counts it (not the dead-lettered counter).
func TestMetrics_DroppedPastRetryLimitIsCountedNotDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.post("/api/v1/configure", `{"queue":"drops","options":{"retryLimit":0,"dlqAfterMaxRetries":false}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("drops", `{"n":1}`, `{"n":2}`)
	got := e.pop("/api/v1/pop/queue/drops?wait=false")
	require.Len(t, got.Messages, 1)
	a := e.ack(got.Messages[0], "failed", "boom")
	assert.True(t, a.Success)
	assert.False(t, a.DLQ)

	r = e.get("/api/v1/dlq?queue=drops")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `0`, string(object(t, r.body)["total"]))
	_, series := scrape(t, e)
	assert.Equal(t, 1.0, series["herald_messages_dropped_total"][`queue="drops"`])
	assert.Zero(t, series["herald_messages_dead_lettered_total"][`queue="drops"`])
	next := e.pop("/api/v1/pop/queue/drops?wait=false")
	require.Len(t, next.Messages, 1)
	assert.JSONEq(t, `{"n":2}`, string(next.Messages[0].Data))
}

// The pops a long-poll or a subscription is served by (the poller's) count
// what they skip and give up on as a plain pop does: a message past its
// queue's ttl in herald_messages_expired_total, one whose expired lease
// used up its retries on a queue that keeps no dead letter in
// herald_messages_dropped_total, one dead-lettered so in
// herald_messages_dead_lettered_total.
func TestMetrics_PollerPopsCountExpiredDroppedAndDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for q, opts := range map[string]string{"lpttl": `{"ttl":60}`, "lpdrop": `{"retryLimit":0,"deadLetterQueue":false}`,
		"lpdead": `{"retryLimit":0}`} {
		r := e.post("/api/v1/configure", `{"queue":"`+q+`","options":`+opts+`}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
	}
	e.push("lpttl", `{"n":"old"}`, `{"n":"young"}`)
	e.exec(`UPDATE messages m SET created_at = m.created_at - interval '2 minutes' FROM partitions p, queues q
		WHERE p.id = m.partition_id AND q.id = p.queue_id AND q.name = 'lpttl' AND m.seq = 1`)
	lp := e.pop("/api/v1/pop/queue/lpttl?wait=true&timeout=5000&batch=10&autoAck=true")
	require.Len(t, lp.Messages, 1)
	assert.JSONEq(t, `{"n":"young"}`, string(lp.Messages[0].Data))

	// A lease that expired with its retries used up: the long-poll's pop
	// gives its message up and delivers the next one.
	for _, q := range []string{"lpdrop", "lpdead"} {
		e.push(q, `{"n":1}`, `{"n":2}`)
		held := e.pop("/api/v1/pop/queue/" + q + "?wait=false&batch=1")
		require.Len(t, held.Messages, 1)
		e.exec(`UPDATE consumers c SET lease_expires_at = now() - interval '1 second' FROM queues q
			WHERE q.id = c.queue_id AND q.name = $1`, q)
		next := e.pop("/api/v1/pop/queue/" + q + "?wait=true&timeout=5000&batch=10")
		require.Len(t, next.Messages, 1, q)
		assert.JSONEq(t, `{"n":2}`, string(next.Messages[0].Data), q)
	}

	_, series := scrape(t, e)
	assert.Equal(t, 1.0, series["herald_messages_expired_total"][`queue="lpttl"`], "the long-poll's skip")
	assert.Equal(t, 1.0, series["herald_messages_dropped_total"][`queue="lpdrop"`], "the long-poll's drop")
	assert.Equal(t, 1.0, series["herald_messages_dead_lettered_total"][`queue="lpdead"`], "the long-poll's dead letter")
}

// A replay settles an expired lease before it moves the cursor back, and
// what that settling gives up on is counted as a pop's is: on a queue that
// keeps dead letters in herald_messages_dead_lettered_total, on one that
// no longer does in herald_messages_dropped_total.
func TestMetrics_ReplayCountsWhatItsSettlingGivesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, q := range []string{"rpdead", "rpdrop"} {
		r := e.post("/api/v1/configure", `{"queue":"`+q+`","options":{"retryLimit":0}}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		e.push(q, `{"n":1}`, `{"n":2}`)
		held := e.pop("/api/v1/pop/queue/" + q + "?wait=false&batch=2")
		require.Len(t, held.Messages, 2)
		a := e.ack(held.Messages[1], "dlq", "boom")
		require.True(t, a.Success)
		e.exec(`UPDATE consumers c SET lease_expires_at = now() - interval '1 second' FROM queues q
			WHERE q.id = c.queue_id AND q.name = $1`, q)
	}
	// rpdrop keeps no dead letter from now on: message 1, given up on by
	// the settling, is dropped; its message 2 was dead-lettered before.
	r := e.post("/api/v1/configure", `{"queue":"rpdrop","options":{"retryLimit":0,"deadLetterQueue":false}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	_, before := scrape(t, e)
	for _, q := range []string{"rpdead", "rpdrop"} {
		r = e.post("/api/v1/dlq/replay", `{"filter":{"queue":"`+q+`"}}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.JSONEq(t, `1`, string(object(t, r.body)["replayed"]), "%s: %s", q, r)
	}
	_, after := scrape(t, e)
	assert.Equal(t, 1.0, after["herald_messages_dead_lettered_total"][`queue="rpdead"`]-
		before["herald_messages_dead_lettered_total"][`queue="rpdead"`], "the replay's settling dead-lettered message 1")
	assert.Equal(t, 1.0, after["herald_messages_dropped_total"][`queue="rpdrop"`]-
		before["herald_messages_dropped_total"][`queue="rpdrop"`], "the replay's settling dropped message 1")
	assert.Equal(t, before["herald_messages_dead_lettered_total"][`queue="rpdrop"`],
		after["herald_messages_dead_lettered_total"][`queue="rpdrop"`])
}

// Every pop path (a client's pop, a long-poll, a WebSocket subscription,
// an SSE stream) counts what its pop skipped once and only once: the store
// tells the gateway of each pop's (queue.Config.OnGivenUp), and no path
// counts it again. Each path reads a queue with a ttl holding one message
// past it and one young: it is delivered the young one, and
// herald_messages_expired_total counts exactly the one skipped.
func TestMetrics_EachPopPathCountsWhatItSkippedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	paths := map[string]func(q string) message{
		"pop": func(q string) message {
			got := e.pop("/api/v1/pop/queue/" + q + "?wait=false&batch=10")
			require.Len(t, got.Messages, 1)
			return got.Messages[0]
		},
		"long-poll": func(q string) message {
			got := e.pop("/api/v1/pop/queue/" + q + "?wait=true&timeout=5000&batch=10")
			require.Len(t, got.Messages, 1)
			return got.Messages[0]
		},
		"websocket": func(q string) message {
			c := e.dialWS(t)
			c.subscribe(`{"type":"subscribe","id":1,"queue":"` + q + `","batch":10}`)
			ms := deliveredMessages(t, c.next("deliver"))
			require.Len(t, ms, 1)
			return ms[0]
		},
		"sse": func(q string) message {
			c := e.openSSE(t, "/api/v1/sse/queue/"+q, nil)
			m, _ := c.next()
			return m
		},
	}
	for name, consume := range paths {
		q := "skip-" + strings.ReplaceAll(name, "-", "")
		r := e.post("/api/v1/configure", `{"queue":"`+q+`","options":{"ttl":60}}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		e.push(q, `{"n":"old"}`, `{"n":"young"}`)
		e.exec(`UPDATE messages m SET created_at = m.created_at - interval '2 minutes' FROM partitions p, queues q
			WHERE p.id = m.partition_id AND q.id = p.queue_id AND q.name = $1 AND m.seq = 1`, q)
		assert.JSONEq(t, `{"n":"young"}`, string(consume(q).Data), name)
	}
	// The count is made before the pop returns, so before any delivery.
	_, series := scrape(t, e)
	for name := range paths {
		q := "skip-" + strings.ReplaceAll(name, "-", "")
		assert.Equal(t, 1.0, series["herald_messages_expired_total"][`queue="`+q+`"`], name)
	}
}
