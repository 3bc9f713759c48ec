package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/api.md: partition ids are read in any case. The message routes
// read and delete a message named by its partition id in upper case, for
// a token whose rights cover the partition, as in lower case; the answer
// spells the id in lower case.
func TestBrowse_MessageReadsPartitionIdInAnyCase(t *testing.T) {
	e := newAuthEnv(t)
	bob := mailbox(t, "bob")
	r := e.doAuth(http.MethodPost, "/api/v1/push", bob, `{"items":[{"queue":"mail","partition":"bob","payload":1},`+
		`{"queue":"mail","partition":"bob","payload":2}]}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r)
	var pushed []pushResult
	require.NoError(t, json.Unmarshal(r.body, &pushed))
	pid := pushed[0].PartitionID
	upper := strings.ToUpper(pid)
	require.NotEqual(t, pid, upper)

	lower := e.doAuth(http.MethodGet, "/api/v1/messages/"+pid+"/"+pushed[0].TransactionID, bob, "")
	require.Equal(t, http.StatusOK, lower.status, "%s", lower)
	r = e.doAuth(http.MethodGet, "/api/v1/messages/"+upper+"/"+pushed[0].TransactionID, bob, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, string(object(t, lower.body)["partitionId"]), string(object(t, r.body)["partitionId"]))
	assert.Equal(t, string(object(t, lower.body)["payload"]), string(object(t, r.body)["payload"]))

	r = e.doAuth(http.MethodDelete, "/api/v1/messages/"+upper+"/"+pushed[1].TransactionID, bob, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `"`+pid+`"`, string(object(t, r.body)["partitionId"]))
	r = e.doAuth(http.MethodGet, "/api/v1/messages/"+pid+"/"+pushed[1].TransactionID, bob, "")
	assert.Equal(t, http.StatusNotFound, r.status, "deleted: %s", r)
}
