package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// The worked example of docs/operating.md (Auth) runs as printed: herald token mints
// alice's and bob's tokens with the server's secret; bob pushes to his
// mailbox; alice cannot read it; bob can. (The server is this test's, with
// the same secret; the live SSE line is left out: it never ends.)
func TestOperatingDoc_MailboxExampleRuns(t *testing.T) {
	lines := docBlock(t, "docs/operating.md", "sh", "export HERALD_AUTH_SECRET=")
	require.Len(t, lines, 8)
	bin := buildHerald(t)
	secret := strings.Repeat("s3cr3t-", 8)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-secret", secret)
	host := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://"), "/")
	script := strings.Join([]string{lines[2], lines[3], "echo PUSH; " + lines[4], "echo; echo ALICE; " + lines[5],
		"echo; echo BOB; " + lines[6]}, "\n")
	script = strings.ReplaceAll(script, "go run ./cmd/herald", bin)
	script = strings.ReplaceAll(script, "localhost:6632", host)
	cmd := exec.CommandContext(context.Background(), "sh", "-c", script) // #nosec G204 -- the documentation's own lines
	cmd.Env = append(os.Environ(), "HERALD_AUTH_SECRET="+secret)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("%s", out)
	_, rest, _ := strings.Cut(string(out), "PUSH\n")
	pushed, rest, _ := strings.Cut(rest, "\nALICE\n")
	alice, bob, _ := strings.Cut(rest, "\nBOB\n")
	var queued []struct{ Status string }
	require.NoError(t, json.Unmarshal([]byte(pushed), &queued), pushed)
	require.Len(t, queued, 1)
	assert.Equal(t, "queued", queued[0].Status)
	assert.Contains(t, alice, "this token may not consume mail/bob")
	assert.Contains(t, bob, `"data":{"hi":"bob"}`)
}
