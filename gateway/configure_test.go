package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// intOptions are configure's integer options with their documented ranges
// (README, queue.OptionRanges).
var intOptions = []struct {
	name     string
	min, max int64
}{
	{"leaseTime", 1, 86400}, {"retryLimit", 0, 10000}, {"retryDelay", 0, 86400000},
	{"delayedProcessing", 0, 2592000}, {"windowBuffer", 0, 86400}, {"maxSize", 0, 1000000000},
	{"ttl", 0, 315360000}, {"retentionSeconds", 0, 315360000}, {"completedRetentionSeconds", 0, 315360000},
	{"priority", 0, 1000000}, {"maxWaitTimeSeconds", 0, 315360000}, {"idleGroupRetentionSeconds", 0, 315360000},
}

// An integer option past int4 (2^31 … 2^63−1) reached pgx, which
// cannot encode it, and configure answered 500, which clients retry. Every
// integer option is bounded: out of range is a 400 naming the option and
// its range, and nothing is stored.
func TestConfigure_IntegerOutOfRangeIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// An existing queue whose settings a refused configure must not touch.
	r := e.post("/api/v1/configure", `{"queue":"h7-existing","options":{"leaseTime":60,"retryLimit":5}}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	stored := func(q string) (n int, lease, retries int, version int64) {
		t.Helper()
		err := e.store.Pool().QueryRow(ctxT(t), `SELECT count(*) OVER (), lease_time, retry_limit, version
			FROM queues WHERE name = $1`, q).Scan(&n, &lease, &retries, &version)
		if err != nil {
			return 0, 0, 0, 0 // no row
		}
		return n, lease, retries, version
	}
	_, _, _, v0 := stored("h7-existing")
	require.NotZero(t, v0)

	for _, o := range intOptions {
		values := []string{"2147483648", "9007199254740992", "9223372036854775807", "18446744073709551616",
			strconv.FormatInt(o.max+1, 10), strconv.FormatInt(o.min-1, 10), "-9223372036854775808"}
		for _, v := range values {
			for _, q := range []string{"h7-new", "h7-existing"} {
				t.Run(fmt.Sprintf("%s=%s/%s", o.name, v, q), func(t *testing.T) {
					r := e.post("/api/v1/configure", fmt.Sprintf(`{"queue":%q,"options":{%q:%s}}`, q, o.name, v))
					require.Equal(t, http.StatusBadRequest, r.status, "%s", r)
					var body map[string]string
					require.NoError(t, json.Unmarshal(r.body, &body), "%s", r)
					require.Len(t, body, 1, "%s", r)
					assert.Equal(t, fmt.Sprintf("options.%s must be an integer between %d and %d", o.name, o.min, o.max),
						body["error"])
				})
			}
		}
		// The bounds themselves are accepted.
		for _, v := range []int64{o.min, o.max} {
			q := fmt.Sprintf("h7-edge-%s-%d", o.name, v)
			r := e.post("/api/v1/configure", fmt.Sprintf(`{"queue":%q,"options":{%q:%d}}`, q, o.name, v))
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			var got struct{ Options map[string]json.RawMessage }
			require.NoError(t, json.Unmarshal(r.body, &got))
			assert.Equal(t, strconv.FormatInt(v, 10), string(got.Options[o.name]), o.name)
		}
	}
	// Nothing stored: no new queue, the existing one as it was.
	n, _, _, _ := stored("h7-new")
	assert.Zero(t, n, "a refused configure created the queue")
	_, lease, retries, v := stored("h7-existing")
	assert.Equal(t, 60, lease)
	assert.Equal(t, 5, retries)
	assert.Equal(t, v0, v, "a refused configure bumped the version")
}
