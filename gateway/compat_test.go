package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Behaviours the Queen client libraries rely on beyond the captured
// examples (see the README's compatibility notes).
func TestCompat_QueenClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	t.Run("OutOfRangeValuesAreClamped", func(t *testing.T) {
		e.push("clamp", `{"n":1}`)
		res := e.pop("/api/v1/pop/queue/clamp?batch=999999&partitions=5000&wait=false")
		assert.Len(t, res.Messages, 1)
		e.popEmpty("/api/v1/pop/queue/clamp?batch=99999999999999999999999&wait=false")
	})

	t.Run("AutopilotBatchDefault", func(t *testing.T) {
		var payloads []string
		for i := 0; i < 250; i++ {
			payloads = append(payloads, `{}`)
		}
		e.push("autopilot", payloads...)
		assert.Len(t, e.pop("/api/v1/pop/queue/autopilot?autopilot=true&consumerGroup=a&wait=false").Messages, 200)
		assert.Len(t, e.pop("/api/v1/pop/queue/autopilot?consumerGroup=b&wait=false").Messages, 1, "without autopilot the batch is 1")
	})

	t.Run("TaskOnlyPop", func(t *testing.T) {
		e.push("tasks.resize", `{"n":2}`) // namespace tasks, task resize
		e.push("other.resize", `{"n":3}`) // another namespace, same task
		res := e.pop("/api/v1/pop?task=resize&batch=10&partitions=10&wait=false")
		got := map[string]bool{}
		for _, m := range res.Messages {
			got[m.Queue] = true
		}
		assert.Len(t, res.Messages, 2)
		assert.True(t, got["tasks.resize"] && got["other.resize"], "%v", got)
	})

	t.Run("SubscriptionModeNewOnly", func(t *testing.T) {
		e.push("newonly", `{"old":true}`)
		e.popEmpty("/api/v1/pop/queue/newonly?consumerGroup=g&subscriptionMode=new-only&wait=false")
		e.push("newonly", `{"new":true}`)
		res := e.pop("/api/v1/pop/queue/newonly?consumerGroup=g&subscriptionMode=new-only&wait=false")
		require.Len(t, res.Messages, 1)
		assert.JSONEq(t, `{"new":true}`, string(res.Messages[0].Data))
	})

	t.Run("TransactionWithKVIsRefused", func(t *testing.T) {
		r := e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[{"queue":"kvtx"}]}],"kv":[{"op":"check","key":"k"}]}`)
		assertError(t, r, http.StatusBadRequest, "kv operations are not supported by this server")
		e.popEmpty("/api/v1/pop/queue/kvtx?wait=false")
		r = e.post("/api/v1/transaction", `{"operations":[{"type":"push","items":[{"queue":"kvtx"}]}],"kv":[],"timers":null}`)
		assert.Equal(t, http.StatusOK, r.status, "empty kv and timers are fine: %s", r)
	})

	t.Run("DLQFilters", func(t *testing.T) {
		e.pushItems(`[{"queue":"dlqf","partition":"a","payload":1},{"queue":"dlqf","partition":"b","payload":2}]`)
		for range 2 {
			res := e.pop("/api/v1/pop/queue/dlqf?wait=false")
			require.Len(t, res.Messages, 1)
			e.ack(res.Messages[0], "dlq", "bad")
		}
		count := func(query string) int {
			r := e.get("/api/v1/dlq?queue=dlqf&" + query)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			var out struct{ Total int }
			require.NoError(t, json.Unmarshal(r.body, &out))
			return out.Total
		}
		assert.Equal(t, 2, count(""))
		assert.Equal(t, 1, count("partition=a"))
		past := url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
		future := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
		assert.Equal(t, 2, count("from="+past+"&to="+future))
		assert.Equal(t, 0, count("from="+future))
		assert.Equal(t, 0, count("to="+past))
		r := e.get("/api/v1/dlq?from=yesterday")
		assertError(t, r, http.StatusBadRequest, "from must be an RFC3339 time")
	})

	t.Run("ConfigureModeValidated", func(t *testing.T) {
		r := e.post("/api/v1/configure", `{"queue":"cm","mode":"sideways"}`)
		assertError(t, r, http.StatusBadRequest, "mode must be merge or replace")
		assert.True(t, strings.Contains(string(e.post("/api/v1/configure", `{"queue":"cm","mode":"merge"}`).body), `"configured":true`))
	})
}
