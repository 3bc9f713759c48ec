package gateway_test

import (
	"net/http"
	"testing"
)

// Issue 16, point 5: every route that reads push or ack items matches
// their names exactly (see TestIssue16_ItemFieldNamesAreCaseSensitive): a
// required field spelt with other cases is missing.
func TestIssue16_RoutesReadItemNamesCaseSensitively(t *testing.T) {
	e := newEnv(t)
	pushErr := "Queue must be a string"
	ackErr := "Each acknowledgment must have a transactionId string"
	for _, c := range []struct{ path, body, msg string }{
		{"/api/v1/push", `{"items":[{"Queue":"q","payload":1}]}`, pushErr},
		{"/api/v1/transaction", `{"operations":[{"type":"push","items":[{"QUEUE":"q"}]}]}`, pushErr},
		{"/api/v1/ack/batch", `{"acknowledgments":[{"TransactionId":"t","partitionId":"p"}]}`, ackErr},
	} {
		assertError(t, e.post(c.path, c.body), http.StatusBadRequest, c.msg)
	}
}
