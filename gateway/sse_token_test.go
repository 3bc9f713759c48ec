package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

func TestToken_RoundTrip(t *testing.T) {
	marks := []queue.LeaseMark{
		{PartitionID: "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d", LeaseID: "0190a3c4-5e6f-7a8b-9c0d-aaaaaaaaaaaa", Through: 1},
		{PartitionID: "0190a3c4-5e6f-7a8b-9c0d-bbbbbbbbbbbb", LeaseID: "", Through: 1 << 40},
	}
	tok := encodeToken(marks)
	assert.NotContains(t, tok, "=", "no padding: the token is a header value")
	got, err := decodeToken(tok)
	require.NoError(t, err)
	assert.Equal(t, marks, got)

	empty, err := decodeToken(encodeToken(nil))
	require.NoError(t, err)
	assert.Empty(t, empty)

	for _, bad := range []string{"!", "AA", "Ag", tok[:len(tok)-3], tok + "A"} {
		_, err := decodeToken(bad)
		assert.ErrorIs(t, err, errBadToken, "%q", bad)
	}
}

// FuzzToken: any Last-Event-ID decodes or is refused, never panics, and a
// decoded token encodes back to the same marks.
func FuzzToken(f *testing.F) {
	f.Add(encodeToken([]queue.LeaseMark{{PartitionID: "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d", LeaseID: "0190a3c4-5e6f-7a8b-9c0d-aaaaaaaaaaaa", Through: 7}}))
	f.Add("")
	f.Add("AQ")
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		marks, err := decodeToken(s)
		if err != nil {
			return
		}
		again, err := decodeToken(encodeToken(marks))
		if err != nil {
			t.Fatalf("re-encoded token refused: %v", err)
		}
		if len(again) != len(marks) {
			t.Fatalf("round trip changed %d marks to %d", len(marks), len(again))
		}
	})
}
