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
	origin := newOrigin()
	tok := encodeToken(origin, marks)
	assert.NotContains(t, tok, "=", "no padding: the token is a header value")
	gotOrigin, got, err := decodeToken(tok)
	require.NoError(t, err)
	assert.Equal(t, marks, got)
	assert.Equal(t, origin, gotOrigin)

	_, empty, err := decodeToken(encodeToken(origin, nil))
	require.NoError(t, err)
	assert.Empty(t, empty)

	for _, bad := range []string{"!", "AA", "Ag", "AgAA", tok[:len(tok)-3], tok + "A"} {
		_, _, err := decodeToken(bad)
		assert.ErrorIs(t, err, errBadToken, "%q", bad)
	}
}

// A token of version 1 (no origin), as a server before chains wrote it,
// still resumes: its marks, and no chain.
func TestToken_VersionOneHasNoOrigin(t *testing.T) {
	// Version 1, one mark: partition …5c6d, lease …aaaa, through 7.
	const v1 = "AQGQo8Reb3qLnA0eLzpLXG0BkKPEXm96i5wNqqqqqqqqBw"
	origin, marks, err := decodeToken(v1)
	require.NoError(t, err)
	assert.Zero(t, origin)
	assert.Equal(t, []queue.LeaseMark{{PartitionID: "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d",
		LeaseID: "0190a3c4-5e6f-7a8b-9c0d-aaaaaaaaaaaa", Through: 7}}, marks)
}

// FuzzToken: any Last-Event-ID decodes or is refused, never panics, and a
// decoded token encodes back to the same marks.
func FuzzToken(f *testing.F) {
	f.Add(encodeToken(streamOrigin{1, 2, 3}, []queue.LeaseMark{{PartitionID: "0190a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d", LeaseID: "0190a3c4-5e6f-7a8b-9c0d-aaaaaaaaaaaa", Through: 7}}))
	f.Add("")
	f.Add("AQ")
	f.Add("Ag")
	f.Add("AQGQo8Reb3qLnA0eLzpLXG0BkKPEXm96i5wNqqqqqqqqBw")
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		origin, marks, err := decodeToken(s)
		if err != nil {
			return
		}
		againOrigin, again, err := decodeToken(encodeToken(origin, marks))
		if err != nil {
			t.Fatalf("re-encoded token refused: %v", err)
		}
		if len(again) != len(marks) || againOrigin != origin {
			t.Fatalf("round trip changed %d marks to %d, origin %x to %x", len(marks), len(again), origin, againOrigin)
		}
	})
}
