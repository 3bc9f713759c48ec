package auth_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
)

// A herald claim's patterns grant what they name and nothing more: a
// partition, every partition of a queue, a glob over either; the whole
// queue only to a pattern covering every partition; a claim of another
// shape grants nothing.
func TestRights_PatternsGrantWhatTheyName(t *testing.T) {
	r, err := auth.ParseRights([]byte(`{"consume":["mail/alice","news","logs/*","t-*/inbox-*"],"produce":["mail/*"],"namespaces":["acme"]}`))
	require.NoError(t, err)
	for _, c := range []struct {
		queue, partition string
		want             bool
	}{
		{"mail", "alice", true},
		{"mail", "bob", false},
		{"mail", "", false}, // the whole queue needs a pattern for every partition
		{"mail", "alice2", false},
		{"news", "", true},
		{"news", "any", true},
		{"logs", "", true},
		{"logs", "x", true},
		{"t-1", "inbox-7", true},
		{"t-1", "outbox", false},
		{"t-1", "", false},
		{"other", "alice", false},
	} {
		assert.Equal(t, c.want, r.MayConsume(c.queue, c.partition), "consume %s/%s", c.queue, c.partition)
	}
	assert.True(t, r.MayProduce("mail", "bob"))
	assert.False(t, r.MayProduce("news", "x"))
	assert.True(t, r.MayUseNamespace("acme", ""))
	assert.True(t, r.MayUseNamespace("acme", "billing"))
	assert.False(t, r.MayUseNamespace("", "billing"), "any namespace is not acme")
	var none *auth.Rights
	assert.True(t, none.MayConsume("any", ""), "no claim: the role decides")

	for _, bad := range []string{`[]`, `{"consume":"mail"}`, `{"consume":[""]}`, `{"consume":["a/b/c"]}`, `{"consume":["/p"]}`,
		`{"consume":["q/"]}`, `{"read":["x"]}`, `{"consume":[1]}`, `{} {}`} {
		_, err := auth.ParseRights([]byte(bad))
		assert.ErrorIs(t, err, auth.ErrBadRights, bad)
	}
}

// The example claim of docs/operating.md (Auth) is one ParseRights reads.
func TestRights_OperatingDocClaimParses(t *testing.T) {
	b, err := os.ReadFile("../docs/operating.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "```json\n{\"sub\": \"alice\"")
	require.True(t, ok, "the example claim of docs/operating.md")
	block, _, _ := strings.Cut(`{"sub": "alice"`+rest, "```")
	var token struct{ Herald json.RawMessage }
	require.NoError(t, json.Unmarshal([]byte(block), &token))
	r, err := auth.ParseRights(token.Herald)
	require.NoError(t, err)
	assert.True(t, r.MayConsume("mail", "alice"))
	assert.False(t, r.MayConsume("mail", "bob"))
}

// FuzzParseRights: whatever a claim says, a whole-queue grant implies
// every partition of the queue, and no check panics.
func FuzzParseRights(f *testing.F) {
	for _, s := range []string{`{"consume":["mail/alice"],"produce":["*"]}`, `{"namespaces":["a/b"]}`, `{}`, `{"consume":["**/*a*"]}`} {
		f.Add([]byte(s), "mail", "alice")
	}
	f.Fuzz(func(t *testing.T, claim []byte, queue, partition string) {
		r, err := auth.ParseRights(claim)
		if err != nil {
			return
		}
		// Whatever the patterns, a whole-queue grant implies every partition.
		if r.MayConsume(queue, "") && partition != "" {
			require.True(t, r.MayConsume(queue, partition), "%s: %s/%s", claim, queue, partition)
		}
		_ = r.MayProduce(queue, partition)
		_ = r.MayUseNamespace(queue, partition)
	})
}
