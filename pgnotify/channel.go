package pgnotify

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// channelPrefix starts every Herald notification channel. The channel
// carries the schema, so Heralds on different schemas of one database (as
// the tests run) do not wake each other.
const channelPrefix = "herald."

// Channel returns the notification channel of the schema the pool's
// connections use.
func Channel(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return "", fmt.Errorf("reading the current schema: %w", err)
	}
	return channelPrefix + schema, nil
}

// payload encodes a wake-up: the queue, then the partitions that changed,
// one per line (names cannot hold control characters). No partitions means
// "any partition of the queue". A last line of senderMark + sender names
// the instance that sent it, which has woken itself already.
func payload(queue string, partitions []string, sender string) string {
	var b strings.Builder
	b.WriteString(queue)
	for _, p := range partitions {
		if b.Len()+1+len(p) > maxPayload {
			b.Reset()
			b.WriteString(queue) // too many to list: the whole queue is checked
			break
		}
		b.WriteByte('\n')
		b.WriteString(p)
	}
	if sender != "" {
		b.WriteString("\n" + senderMark + sender)
	}
	return b.String()
}

// StatePayload is the notification queue.Store.SetSystemFlag sends on the
// channel when a cluster-wide switch (a maintenance mode) changed; it is
// queue.StateNotifyPayload, spelled here so that pgnotify needs nothing of
// queue (a test keeps the two equal). Its control character keeps it apart
// from every wake-up: no queue name holds one.
const StatePayload = "\x02system_state"

// senderMark starts the sender line: a control character, which no queue
// or partition name holds.
const senderMark = "\x01"

// maxPayload keeps a NOTIFY payload well under Postgres' 8000-byte limit.
const maxPayload = 7000

// parsePayload decodes payload; ok is false for anything that is not a
// Herald wake-up (another producer on the channel): it is ignored.
func parsePayload(s string) (queue string, partitions []string, sender string, ok bool) {
	parts := strings.Split(s, "\n")
	if parts[0] == "" {
		return "", nil, "", false
	}
	if last := parts[len(parts)-1]; len(parts) > 1 && strings.HasPrefix(last, senderMark) {
		sender, parts = last[len(senderMark):], parts[:len(parts)-1]
	}
	return parts[0], parts[1:], sender, true
}

func listenSQL(channel string) string { return "LISTEN " + pgx.Identifier{channel}.Sanitize() }
