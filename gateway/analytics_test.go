package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
)

// jsonType names the JSON type of v as decoded into any.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case float64:
		return "number"
	case string:
		return "string"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// checkFields asserts each "path:type" of spec in doc. A path is keys
// joined by dots; "[]" stands for every element of an array, which must
// have at least one. A type may allow several, "number|null".
func checkFields(t *testing.T, name string, doc any, spec ...string) {
	t.Helper()
	for _, s := range spec {
		path, want, _ := strings.Cut(s, ":")
		var walk func(v any, rest []string, at string)
		walk = func(v any, rest []string, at string) {
			if len(rest) == 0 {
				got := jsonType(v)
				if !strings.Contains("|"+want+"|", "|"+got+"|") {
					t.Errorf("%s: %s is %s, the dashboard reads it as %s", name, at, got, want)
				}
				return
			}
			k := rest[0]
			if k == "[]" {
				a, ok := v.([]any)
				if !ok || len(a) == 0 {
					t.Errorf("%s: %s is %s, want a non-empty array", name, at, jsonType(v))
					return
				}
				for i, e := range a {
					walk(e, rest[1:], fmt.Sprintf("%s[%d]", at, i))
				}
				return
			}
			o, ok := v.(map[string]any)
			if !ok {
				t.Errorf("%s: %s is %s, want an object with %q", name, at, jsonType(v), k)
				return
			}
			e, ok := o[k]
			if !ok {
				t.Errorf("%s: %s has no field %q", name, at, k)
				return
			}
			walk(e, rest[1:], at+"."+k)
		}
		walk(doc, strings.Split(path, "."), "$")
	}
}

// dashboardGet GETs path as the dashboard does and decodes the answer.
func (e *env) dashboardGet(path string) any {
	e.t.Helper()
	r := e.get(path)
	require.Equal(e.t, http.StatusOK, r.status, "GET %s: %s", path, r)
	var v any
	require.NoError(e.t, json.Unmarshal(r.body, &v), "GET %s", path)
	return v
}

// sum adds field of every element of the array at key of doc (or of doc
// itself when key is ""), keeping those whose queueName is q (any when q
// is "").
func sum(doc any, key, field, q string) float64 {
	arr, _ := doc.([]any)
	if key != "" {
		o, _ := doc.(map[string]any)
		arr, _ = o[key].([]any)
	}
	var n float64
	for _, e := range arr {
		o, _ := e.(map[string]any)
		if q != "" && o["queueName"] != q {
			continue
		}
		f, _ := o[field].(float64)
		n += f
	}
	return n
}

// The reference server's dashboard (github.com/smartpricing/queen, app/,
// at ab23212) calls these routes with these query strings; the fields
// each view reads are listed with its file. The test pushes, pops, acks,
// parks a long-poll and lets retention delete, then replays the calls and
// checks every field is there with the type the view reads, and that the
// figures count what was done.
func TestAnalytics_DashboardCallsGetTheFieldsItsViewsRead(t *testing.T) {
	e, _ := newInstance(t, servertest.SharedDSN(t), "none", func(c *server.Config) {
		c.RetentionInterval = 200 * time.Millisecond
	})
	// Traffic: 3 pushes to ana (one request), 2 popped, one acked
	// completed and one failed; an empty pop; a queue whose message
	// retention deletes after a second.
	e.push("ana", `{"n":1}`, `{"n":2}`, `{"n":3}`)
	popped := e.pop("/api/v1/pop/queue/ana?wait=false&batch=2")
	require.Len(t, popped.Messages, 2)
	assert.True(t, e.ack(popped.Messages[0], "completed", "").Success)
	assert.True(t, e.ack(popped.Messages[1], "failed", "boom").Success)
	e.popEmpty("/api/v1/pop/queue/ana-empty?wait=false")
	r := e.post("/api/v1/configure", `{"queue":"ana-ret","options":{"retentionEnabled":true,"retentionSeconds":1}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	e.push("ana-ret", `{"old":true}`)
	// A long-poll waiting on ana-park while the sampler runs.
	r = e.post("/api/v1/configure", `{"queue":"ana-park"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	ctx, cancel := context.WithCancel(ctxT(t))
	parked := make(chan string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/api/v1/pop/queue/ana-park?wait=true&timeout=20000", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			parked <- err.Error()
			return
		}
		_ = res.Body.Close()
		parked <- res.Status
	}()
	defer func() { cancel(); <-parked }()

	// The dashboard sends from and to as Date.toISOString() writes them:
	// to is now, from that many minutes before.
	iso := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
	rng := func(minutes int) string {
		now := time.Now()
		return "from=" + url.QueryEscape(iso(now.Add(-time.Duration(minutes)*time.Minute))) + "&to=" + url.QueryEscape(iso(now))
	}

	// Wait for what the sampler and retention add: a parked long-poll
	// sampled, retention's deletion.
	eventually(t, func() bool {
		d := e.dashboardGet("/api/v1/analytics/queue-parked-replicas?" + rng(60))
		return sum(d, "series", "parkedCount", "ana-park") > 0
	}, "the waiting long-poll is sampled as parked")
	eventually(t, func() bool {
		doc := e.dashboardGet("/api/v1/analytics/retention?" + rng(60)).(map[string]any)
		n, _ := doc["totals"].(map[string]any)["retentionMsgs"].(float64)
		return n >= 1
	}, "retention's deletion is counted")

	// views/QueueOperations.vue fetchData: worker-metrics (no .catch: a
	// failure leaves the page empty), queue-lag, queue-ops, retention,
	// queue-parked-replicas, all with {from, to} (15m, 1h, 6h or 24h).
	for _, minutes := range []int{15, 60, 360, 1440} {
		w := e.dashboardGet("/api/v1/analytics/worker-metrics?" + rng(minutes))
		checkFields(t, "worker-metrics", w, "pointCount:number", "bucketMinutes:number",
			"timeRange.from:string", "timeRange.to:string",
			"timeSeries.[].timestamp:string", "timeSeries.[].pushPerSecond:number", "timeSeries.[].popPerSecond:number",
			"timeSeries.[].ackPerSecond:number", "timeSeries.[].avgLagMs:number", "timeSeries.[].maxLagMs:number",
			"timeSeries.[].avgEventLoopLagMs:number", "timeSeries.[].maxEventLoopLagMs:number",
			"timeSeries.[].avgFreeSlots:number", "timeSeries.[].dbConnections:number",
			"timeSeries.[].avgJobQueueSize:number", "timeSeries.[].maxJobQueueSize:number",
			"timeSeries.[].dbErrors:number", "timeSeries.[].ackFailed:number", "timeSeries.[].dlqCount:number",
			// The rest of the reference's row, read by no view today.
			"timeSeries.[].pushMessages:number", "timeSeries.[].popMessages:number", "timeSeries.[].ackMessages:number",
			"timeSeries.[].pushRequests:number", "timeSeries.[].popRequests:number", "timeSeries.[].ackRequests:number",
			"timeSeries.[].jobsDone:number", "timeSeries.[].minFreeSlots:number", "timeSeries.[].backoffSize:number",
			"timeSeries.[].lagCount:number", "timeSeries.[].ackSuccess:number",
			"workers.[].hostname:string", "workers.[].workerId:number", "workers.[].avgEventLoopLagMs:number",
			"workers.[].maxEventLoopLagMs:number", "workers.[].freeSlots:number", "workers.[].dbConnections:number",
			"workers.[].jobQueueSize:number", "workers.[].lastSeen:string",
			"queues.[].queueName:string", "queues.[].popCount:number", "queues.[].avgLagMs:number", "queues.[].maxLagMs:number",
			"summary.totalPushMessages:number", "summary.totalPopMessages:number", "summary.totalAckMessages:number",
			"summary.totalDbErrors:number", "summary.totalAckFailed:number", "summary.totalDlq:number",
			"summary.pendingMessages:number")
		// The figures count what was done (4 pushes, 2 pops, 1 + 1 acks).
		assert.Equal(t, 4.0, sum(w, "timeSeries", "pushMessages", ""), "pushMessages, %d min", minutes)
		assert.Equal(t, 2.0, sum(w, "timeSeries", "popMessages", ""), "popMessages, %d min", minutes)
		assert.Equal(t, 1.0, sum(w, "timeSeries", "ackSuccess", ""), "ackSuccess, %d min", minutes)
		assert.Equal(t, 1.0, sum(w, "timeSeries", "ackFailed", ""), "ackFailed, %d min", minutes)
		assert.Equal(t, 2.0, sum(w, "queues", "popCount", "ana"), "queues[ana].popCount, %d min", minutes)
		summary := w.(map[string]any)["summary"].(map[string]any)
		assert.Equal(t, 4.0, summary["totalPushMessages"])
		assert.Equal(t, 2.0, summary["totalPopMessages"])
	}
	params := rng(60)
	lag := e.dashboardGet("/api/v1/analytics/queue-lag?" + params)
	checkFields(t, "queue-lag", lag, "[].queueName:string", "[].bucketTime:string", "[].avgLagMs:number",
		"[].popCount:number", "[].maxLagMs:number")
	assert.Equal(t, 2.0, sum(lag, "", "popCount", "ana"))
	ops := e.dashboardGet("/api/v1/analytics/queue-ops?" + params)
	opsFields := []string{"bucketMinutes:number", "queues.[]:string", "timeRange.from:string",
		"series.[].bucket:string", "series.[].queueName:string", "series.[].popPerSecond:number",
		"series.[].pushPerSecond:number", "series.[].ackPerSecond:number", "series.[].emptyPerSecond:number",
		"series.[].popMessages:number", "series.[].popEmpty:number", "series.[].transactions:number",
		"series.[].parkedCount:number", "series.[].partitionCount:number|null", "series.[].partitionsCreated:number",
		"series.[].partitionsDeleted:number", "series.[].avgLagMs:number", "series.[].maxLagMs:number",
		"series.[].pushMessages:number", "series.[].pushRequests:number", "series.[].ackRequests:number",
		"series.[].ackSuccess:number", "series.[].ackFailed:number"}
	checkFields(t, "queue-ops", ops, opsFields...)
	assert.Equal(t, 3.0, sum(ops, "series", "pushMessages", "ana"))
	assert.Equal(t, 2.0, sum(ops, "series", "popMessages", "ana"))
	assert.Equal(t, 1.0, sum(ops, "series", "popEmpty", "ana-empty"))
	ret := e.dashboardGet("/api/v1/analytics/retention?" + params)
	checkFields(t, "retention", ret, "bucketMinutes:number", "series.[].bucket:string", "series.[].retentionMsgs:number",
		"series.[].completedRetentionMsgs:number", "series.[].evictionMsgs:number", "series.[].totalMsgs:number",
		"series.[].eventCount:number", "totals.retentionMsgs:number", "totals.completedRetentionMsgs:number",
		"totals.evictionMsgs:number", "totals.totalMsgs:number", "totals.eventCount:number")
	pr := e.dashboardGet("/api/v1/analytics/queue-parked-replicas?" + params)
	checkFields(t, "queue-parked-replicas", pr, "bucketMinutes:number", "series.[].bucket:string",
		"series.[].queueName:string", "series.[].hostname:string", "series.[].workerId:number",
		"series.[].parkedCount:number", "replicas.[].hostname:string", "replicas.[].workerId:number")

	// views/QueueDetail.vue fetchOps: queue-ops with {from, to, queue}.
	one := e.dashboardGet("/api/v1/analytics/queue-ops?" + params + "&queue=ana")
	checkFields(t, "queue-ops?queue", one, opsFields...)
	for _, s := range one.(map[string]any)["series"].([]any) {
		assert.Equal(t, "ana", s.(map[string]any)["queueName"])
	}
	// views/Queues.vue fetchQueueOps: queue-ops over the last 15 minutes.
	checkFields(t, "queue-ops 15m", e.dashboardGet("/api/v1/analytics/queue-ops?"+rng(15)), opsFields...)

	// views/System.vue fetchData and views/Dashboard.vue
	// fetchSystemMetrics: system-metrics with {from, to}.
	eventually(t, func() bool {
		sys := e.dashboardGet("/api/v1/analytics/system-metrics?" + rng(60)).(map[string]any)
		return sys["pointCount"].(float64) > 0
	}, "system metrics sampled")
	sys := e.dashboardGet("/api/v1/analytics/system-metrics?" + params)
	var metricFields []string
	for _, m := range []string{"cpu.user_us", "cpu.system_us", "memory.rss_bytes", "database.pool_active",
		"database.pool_idle", "database.pool_size", "threadpool.db.queue_size", "threadpool.system.queue_size"} {
		for _, agg := range []string{"avg", "min", "max", "last"} {
			metricFields = append(metricFields, "replicas.[].timeSeries.[].metrics."+m+"."+agg+":number")
		}
	}
	checkFields(t, "system-metrics", sys, append(metricFields, "replicaCount:number", "pointCount:number",
		"bucketMinutes:number", "replicas.[].hostname:string", "replicas.[].port:number", "replicas.[].workerId:number",
		"replicas.[].timeSeries.[].timestamp:string", "replicas.[].timeSeries.[].sampleCount:number")...)
	rss := sys.(map[string]any)["replicas"].([]any)[0].(map[string]any)["timeSeries"].([]any)[0].(map[string]any)["metrics"].(map[string]any)["memory"].(map[string]any)["rss_bytes"].(map[string]any)["last"].(float64)
	assert.Greater(t, rss, 1e6, "the resident size of a Go process is over a megabyte")

	// views/System.vue fetchData (Postgres tab): postgres-stats, no query.
	pg := e.dashboardGet("/api/v1/analytics/postgres-stats")
	checkFields(t, "postgres-stats", pg, "database:string", "timestamp:string",
		"databaseCache.cacheHitRatio:number|null", "cacheSummary.tables.hitRatio:number|null",
		"cacheSummary.indexes.hitRatio:number|null", "bufferConfig.sharedBuffersSize:string",
		"tableCache.[].table:string", "tableCache.[].diskReads:number", "tableCache.[].cacheHits:number",
		"tableCache.[].cacheHitRatio:number|null", "indexCache.[].index:string", "indexCache.[].table:string",
		"indexCache.[].diskReads:number", "indexCache.[].cacheHits:number", "indexCache.[].cacheHitRatio:number|null",
		"tableSizes.[].table:string", "tableSizes.[].totalSize:string", "tableSizes.[].tableSize:string",
		"tableSizes.[].indexSize:string", "deadTuples:array", "hotUpdates:array", "activeQueries:array",
		"autovacuumStatus:array", "bufferUsage:array")
	var tables []string
	for _, ts := range pg.(map[string]any)["tableSizes"].([]any) {
		tables = append(tables, ts.(map[string]any)["table"].(string))
	}
	assert.Contains(t, tables, "messages", "Herald's own tables are listed")
}

// Bad time ranges and filters are refused with a 400 that says why, on
// every analytics route that takes them.
func TestAnalytics_BadRangeOrFilterIsRefused(t *testing.T) {
	e := newEnv(t)
	now := time.Now().UTC()
	iso := func(t time.Time) string { return url.QueryEscape(t.Format(time.RFC3339Nano)) }
	routes := []string{"system-metrics", "worker-metrics", "queue-lag", "queue-ops", "queue-parked-replicas", "retention"}
	for _, route := range routes {
		for _, c := range []struct{ query, msg string }{
			{"from=yesterday", "from must be an RFC 3339 time (2026-01-05T10:00:00.000Z)"},
			{"to=" + iso(now) + "&from=" + iso(now.Add(time.Minute)), "from must be before to"},
			{"to=" + iso(now) + "&from=" + iso(now), "from must be before to"},
			{"to=" + iso(now) + "&from=" + iso(now.Add(-8*24*time.Hour)), "from and to must be at most 168h0m0s apart"},
			{"queue=a%01b", "queue must not contain control characters"},
			{"workerId=abc", "workerId must be an integer between 0 and 2147483647"},
			{"workerId=-1", "workerId must be an integer between 0 and 2147483647"},
		} {
			r := e.get("/api/v1/analytics/" + route + "?" + c.query)
			assert.Equal(t, http.StatusBadRequest, r.status, "%s?%s: %s", route, c.query, r)
			if c.msg != "" {
				assertError(t, r, http.StatusBadRequest, c.msg)
			}
		}
	}
}

// GET /api/v1/status (the dashboard's main view) charts this instance's
// history: throughput buckets that count the pushes, pops and acks made,
// and the instance as a worker.
func TestStatus_ThroughputAndWorkersComeFromTheHistory(t *testing.T) {
	e, _ := newInstance(t, servertest.SharedDSN(t), "none")
	e.push("st-tp", `{"n":1}`, `{"n":2}`, `{"n":3}`)
	popped := e.pop("/api/v1/pop/queue/st-tp?wait=false&batch=2")
	require.Len(t, popped.Messages, 2)
	assert.True(t, e.ack(popped.Messages[0], "completed", "").Success)
	assert.True(t, e.ack(popped.Messages[1], "failed", "boom").Success)
	var doc any
	require.Eventually(t, func() bool { // the sampler's first second
		doc = e.dashboardGet("/api/v1/status?queue=st-tp")
		o := doc.(map[string]any)
		w, _ := o["workers"].([]any)
		return len(w) == 1
	}, 10*time.Second, 50*time.Millisecond, "the instance is a worker")
	checkFields(t, "status", doc, "throughput.[].timestamp:string", "throughput.[].ingested:number",
		"throughput.[].processed:number", "throughput.[].popMessages:number", "throughput.[].ingestedPerSecond:number",
		"throughput.[].avgLagMs:number", "throughput.[].queenRssMb:number", "throughput.[].dbPoolSize:number",
		"workers.[].hostname:string", "workers.[].workerId:number", "workers.[].messagesProcessed:number", "pointCount:number")
	assert.Equal(t, 3.0, sum(doc, "throughput", "ingested", ""), "the pushes")
	assert.Equal(t, 2.0, sum(doc, "throughput", "popMessages", ""), "the pops")
	assert.Equal(t, 2.0, sum(doc, "throughput", "processed", ""), "the acks")
	assert.Equal(t, 1.0, sum(doc, "throughput", "ackFailed", ""), "the failed ack")
	other := e.dashboardGet("/api/v1/status?queue=st-other")
	assert.Zero(t, sum(other, "throughput", "ingested", ""), "another queue's figures")
}
