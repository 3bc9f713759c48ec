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
// "any partition of the queue".
func payload(queue string, partitions []string) string {
	var b strings.Builder
	b.WriteString(queue)
	for _, p := range partitions {
		if b.Len()+1+len(p) > maxPayload {
			return queue // too many to list: the whole queue is checked
		}
		b.WriteByte('\n')
		b.WriteString(p)
	}
	return b.String()
}

// maxPayload keeps a NOTIFY payload well under Postgres' 8000-byte limit.
const maxPayload = 7000

// parsePayload decodes payload; ok is false for anything that is not a
// Herald wake-up (another producer on the channel): it is ignored.
func parsePayload(s string) (queue string, partitions []string, ok bool) {
	parts := strings.Split(s, "\n")
	if parts[0] == "" {
		return "", nil, false
	}
	return parts[0], parts[1:], true
}

func listenSQL(channel string) string { return "LISTEN " + pgx.Identifier{channel}.Sanitize() }
