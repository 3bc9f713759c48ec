package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Seconds ≥ 2^31 was narrowed to 32 bits, which ended the
// lease (expiresAt 1958) and answered success; the WebSocket renew shares the
// code. Every out-of-range value is now a 400 (an error frame on the
// WebSocket) and leaves the lease as it was.
func TestLease_ExtendSecondsAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.push("ext", `1`)
	p := e.pop("/api/v1/pop/queue/ext")
	require.Len(t, p.Messages, 1)
	for _, secs := range []string{"2147483648", "2147483647", "86401", "-1", "9223372036854775807", "1e40", "1.5"} {
		r := e.post("/api/v1/lease/"+p.LeaseID+"/extend", `{"seconds":`+secs+`}`)
		assert.Equal(t, http.StatusBadRequest, r.status, "seconds=%s: %s", secs, r)
		assert.Contains(t, string(r.body), "between 0 and 86400", "seconds=%s", secs)
	}
	c := e.dialWS(t)
	for _, secs := range []string{"2147483648", "86401", "-5"} {
		c.send(fmt.Sprintf(`{"type":"renew","id":"r","leaseId":%q,"seconds":%s}`, p.LeaseID, secs))
		f := c.next("error")
		assert.JSONEq(t, `"bad_request"`, string(f["code"]), "seconds=%s: %v", secs, f)
	}
	// Still leased to its holder: nobody else gets the message, and the
	// holder's ack is taken.
	e.popEmpty("/api/v1/pop/queue/ext")
	var acks []ackResult
	r := e.post("/api/v1/ack/batch", fmt.Sprintf(`{"acknowledgments":[{"transactionId":%q,"partitionId":%q,"leaseId":%q}]}`,
		p.Messages[0].TransactionID, p.PartitionID, p.LeaseID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	require.NoError(t, json.Unmarshal(r.body, &acks))
	assert.True(t, acks[0].Success, "%s", r)
}
