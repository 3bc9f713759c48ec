package gateway_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A WebSocket frame's own fields were read without
// regard to case ({"TYPE":"ack","ITEMS":[…]} acked), while push and ack
// items match exactly. A frame naming a field in other case is refused
// with a bad_request naming it; unknown fields are still ignored.
func TestJSON_WSFrameFieldNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.dialWS(t)
	for _, frame := range []string{
		`{"TYPE":"ping","id":1}`,
		`{"type":"ping","ID":1}`,
		`{"type":"subscribe","Queue":"wsc","id":1}`,
	} {
		c.send(frame)
		f := c.next("error")
		assert.JSONEq(t, `"bad_request"`, string(f["code"]), frame)
		assert.Contains(t, string(f["message"]), "case-sensitive", frame)
	}
	c.send(`{"type":"ping","id":2,"extra":true}`)
	f := c.next("pong")
	assert.JSONEq(t, `2`, string(f["id"]))
}

// Every route that reads push or ack items matches
// their names exactly (see TestJSON_ItemFieldNamesAreCaseSensitive): a
// required field spelt with other cases is missing.
func TestJSON_RoutesReadItemNamesCaseSensitively(t *testing.T) {
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
