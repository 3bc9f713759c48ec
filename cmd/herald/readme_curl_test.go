package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

// readmeBlock returns the lines of the README's first code block (fenced
// with lang) whose first line starts with first.
func readmeBlock(t *testing.T, lang, first string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	for _, block := range markdownBlocks(string(b), lang) {
		if strings.HasPrefix(block, first) {
			return strings.Split(block, "\n")
		}
	}
	t.Fatalf("no ```%s block starting with %q in README.md", lang, first)
	return nil
}

// The README's curl lines (push, pop, ack, a live SSE stream, a
// follow stream from the beginning) run
// as printed against a real server (its address in place of
// localhost:6632), the ack with the ids the pop answered in place of "…".
func TestReadme_CurlExamplesRun(t *testing.T) {
	_, err := exec.LookPath("curl")
	require.NoError(t, err, "the README's examples use curl (apt-get install -y curl)")
	lines := readmeBlock(t, "sh", "curl -s -XPOST localhost:6632/api/v1/push")
	require.Len(t, lines, 5, "push, pop, ack, sse, follow")
	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t))
	host := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://"), "/")
	line := func(i int) string { return strings.ReplaceAll(lines[i], "localhost:6632", host) }
	sh := func(ctx context.Context, cmdline string) *exec.Cmd {
		return exec.CommandContext(ctx, "sh", "-c", cmdline) // #nosec G204 -- the README's own lines
	}

	out, err := sh(t.Context(), line(0)).Output()
	require.NoError(t, err)
	var pushed []struct{ Status, TransactionID string }
	require.NoError(t, json.Unmarshal(out, &pushed), "%s", out)
	require.Len(t, pushed, 1)
	assert.Equal(t, "queued", pushed[0].Status)

	out, err = sh(t.Context(), line(1)).Output()
	require.NoError(t, err)
	var popped struct {
		Messages []struct {
			TransactionID, PartitionID, LeaseID string
			Data                                json.RawMessage
		}
	}
	require.NoError(t, json.Unmarshal(out, &popped), "%s", out)
	require.Len(t, popped.Messages, 1)
	m := popped.Messages[0]
	assert.JSONEq(t, `{"id":1}`, string(m.Data))

	ack := line(2)
	require.Equal(t, 3, strings.Count(ack, "…"), "the ack line's placeholders")
	for _, v := range []string{m.TransactionID, m.PartitionID, m.LeaseID} {
		ack = strings.Replace(ack, "…", v, 1)
	}
	out, err = sh(t.Context(), ack).Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), `"success":true`)

	// The stream: a second push arrives on it as an SSE event.
	_, err = sh(t.Context(), line(0)).Output()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream := sh(ctx, line(3))
	stdout, err := stream.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, stream.Start())
	defer func() { cancel(); _ = stream.Wait() }()
	sc := bufio.NewScanner(stdout)
	event := ""
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data:") {
		if strings.HasPrefix(sc.Text(), "event:") {
			event = strings.TrimSpace(strings.TrimPrefix(sc.Text(), "event:"))
		}
	}
	require.True(t, strings.HasPrefix(sc.Text(), "data:"), "an event on the stream")
	assert.Equal(t, "message", event)
	assert.Contains(t, sc.Text(), `"data":{"id":1}`)

	// The follow stream: both messages pushed (consumed or not), each with
	// an event id, after the start's id.
	follow := sh(ctx, line(4))
	fout, err := follow.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, follow.Start())
	defer func() { cancel(); _ = follow.Wait() }()
	fs := bufio.NewScanner(fout)
	var events, ids, data []string
	for len(data) < 2 && fs.Scan() {
		switch l := fs.Text(); {
		case strings.HasPrefix(l, "event: "):
			events = append(events, l[7:])
		case strings.HasPrefix(l, "id: "):
			ids = append(ids, l[4:])
		case strings.HasPrefix(l, "data: "):
			data = append(data, l[6:])
		}
	}
	require.Len(t, data, 2, "the two messages")
	assert.Equal(t, []string{"message", "message"}, events)
	require.Len(t, ids, 3, "the start's, then each message's")
	assert.Contains(t, data[0], `"data":{"id":1}`)
	assert.Contains(t, data[1], `"data":{"id":1}`)
	assert.Contains(t, data[1], `"eventId":"`+ids[2]+`"`)
}
