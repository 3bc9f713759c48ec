package gateway_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Subscription modes as the reference server's clients use them:
// "new" (or new-only) starts after what is in the queue; any other mode
// ("from_beginning", "all", anything) reads from the beginning (was 400);
// a subscriptionFrom time wins over mode new; queue mode ignores both; the
// first subscription of a group fixes its start, later ones are ignored.
func TestSubscription_Modes(t *testing.T) {
	e := newEnv(t)
	data := func(path string) []string {
		t.Helper()
		res := e.pop(path)
		var out []string
		for _, m := range res.Messages {
			out = append(out, string(m.Data))
		}
		return out
	}
	e.push("modes", `1`, `2`)
	for _, mode := range []string{"from_beginning", "all", "whatever"} {
		assert.Equal(t, []string{"1", "2"}, data("/api/v1/pop/queue/modes?consumerGroup="+mode+"&subscriptionMode="+mode+
			"&batch=10&autoAck=true&wait=false"), mode)
	}
	e.popEmpty("/api/v1/pop/queue/modes?consumerGroup=fresh&subscriptionMode=new&wait=false")
	r := e.do(http.MethodGet, "/api/v1/pop/queue/modes?subscriptionMode=new&batch=10&autoAck=true&wait=false", "")
	require.Equal(t, http.StatusOK, r.status, "queue mode reads everything, mode new or not: %s", r)

	// A time wins over mode new: the group starts after the time, here
	// before both messages.
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	assert.Equal(t, []string{"1", "2"}, data("/api/v1/pop/queue/modes?consumerGroup=timed&subscriptionMode=new&subscriptionFrom="+
		past+"&batch=10&autoAck=true&wait=false"))

	// First subscription wins: "fresh" subscribed as new; asking for
	// everything now changes nothing.
	e.push("modes", `3`)
	assert.Equal(t, []string{"3"}, data("/api/v1/pop/queue/modes?consumerGroup=fresh&subscriptionMode=all&batch=10&autoAck=true&wait=false"))
}
