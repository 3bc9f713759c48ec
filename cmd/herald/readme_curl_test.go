package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	return docBlock(t, "README.md", lang, first)
}

// docBlock returns the lines of the first code block of page (a markdown
// file, from the repository's root) fenced with lang whose first line
// starts with first.
func docBlock(t *testing.T, page, lang, first string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, page))
	require.NoError(t, err)
	for _, block := range markdownBlocks(string(b), lang) {
		if strings.HasPrefix(block, first) {
			return strings.Split(block, "\n")
		}
	}
	t.Fatalf("no ```%s block starting with %q in %s", lang, first, page)
	return nil
}

// The README's first-message lines (push two, pop one, ack it with the ids
// the pop answered, a live SSE stream, a follow stream from the beginning)
// run as printed, in order, against a real server (its address in place of
// localhost:6632): the lines up to the ack in one shell, so the ack uses the
// variables the pop line set; no line has a placeholder to fill in. Each
// step is checked: both pushes queued, the pop leased message 1, the ack
// succeeded and ended the lease (the partition is free again), the SSE
// stream receives message 2 at once, and the follow stream shows both.
func TestReadmeCurlExamples_RunInOrderAndAckWhatThePopLeased(t *testing.T) {
	_, err := exec.LookPath("curl")
	require.NoError(t, err, "the README's examples use curl (apt-get install -y curl)")
	lines := readmeBlock(t, "sh", "curl -s -XPOST localhost:6632/api/v1/push")
	require.Len(t, lines, 6, "push, pop, the id helper, ack, sse, follow")
	for i, l := range lines {
		require.NotContains(t, l, "…", "line %d is run as printed: no placeholder to fill in", i+1)
	}
	bin := buildHerald(t)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t))
	host := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://"), "/")
	line := func(i int) string { return strings.ReplaceAll(lines[i], "localhost:6632", host) }
	sh := func(ctx context.Context, cmdline string) *exec.Cmd {
		return exec.CommandContext(ctx, "sh", "-c", cmdline) // #nosec G204 -- the README's own lines
	}

	// Push, pop, the helper, ack: one shell, each step's output after a mark.
	var script []string
	for i := range 4 {
		script = append(script, fmt.Sprintf("echo; echo '@@%d'", i), line(i))
	}
	out, err := sh(t.Context(), strings.Join(script, "\n")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	step := map[int]string{}
	for _, part := range strings.Split(string(out), "@@")[1:] {
		n, rest, _ := strings.Cut(part, "\n")
		i, err := strconv.Atoi(n)
		require.NoError(t, err, "%s", out)
		step[i] = strings.TrimSpace(rest)
	}

	var pushed []struct{ Status string }
	require.NoError(t, json.Unmarshal([]byte(step[0]), &pushed), "the push: %s", step[0])
	require.Len(t, pushed, 2)
	assert.Equal(t, "queued", pushed[0].Status)
	assert.Equal(t, "queued", pushed[1].Status)

	var popped struct {
		Messages []struct {
			TransactionID, PartitionID, LeaseID string
			Data                                json.RawMessage
		}
	}
	require.NoError(t, json.Unmarshal([]byte(step[1]), &popped), "the pop: %s", step[1])
	require.Len(t, popped.Messages, 1)
	m := popped.Messages[0]
	assert.JSONEq(t, `{"id":1}`, string(m.Data))
	assert.Empty(t, step[2], "the helper's line prints nothing")

	var acked []struct {
		Success, LeaseReleased bool
		TransactionID          string
		Error                  *string
	}
	require.NoError(t, json.Unmarshal([]byte(step[3]), &acked), "the ack: %s", step[3])
	require.Len(t, acked, 1)
	assert.True(t, acked[0].Success, "the ack: %s", step[3])
	assert.True(t, acked[0].LeaseReleased, "the ack ends the pop's lease: %s", step[3])
	assert.Equal(t, m.TransactionID, acked[0].TransactionID, "the ack names the message the pop leased")

	// The partition is free again: no lease held, the queue mode's cursor past message 1.
	resp, err := http.Get(p.url + "api/v1/resources/partitions?queue=orders")
	require.NoError(t, err)
	var parts struct {
		Partitions []struct {
			Groups []struct {
				Name   string
				Cursor int64
				Lease  *json.RawMessage
			}
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&parts))
	_ = resp.Body.Close()
	require.Len(t, parts.Partitions, 1)
	require.Len(t, parts.Partitions[0].Groups, 1)
	g := parts.Partitions[0].Groups[0]
	assert.Equal(t, "__QUEUE_MODE__", g.Name)
	assert.Equal(t, int64(1), g.Cursor, "message 1 is done")
	assert.Nil(t, g.Lease, "no lease is left on the partition after the ack")

	// The stream right after: message 2 arrives at once (a lease left by
	// the pop would hold it back for the queue's lease time, 5 minutes).
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	stream := sh(ctx, line(4))
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
	require.True(t, strings.HasPrefix(sc.Text(), "data:"), "an event on the stream within 20 s")
	assert.Equal(t, "message", event)
	assert.Contains(t, sc.Text(), `"data":{"id":2}`)

	// The follow stream: both messages pushed (consumed or not), each with
	// an event id, after the start's id.
	follow := sh(ctx, line(5))
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
	assert.Contains(t, data[1], `"data":{"id":2}`)
	assert.Contains(t, data[1], `"eventId":"`+ids[2]+`"`)
}
