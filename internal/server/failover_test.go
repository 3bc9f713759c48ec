package server_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/queue"
)

// Herald's database connections are cut mid-statement, over and over
// (pg_terminate_backend on one of its backends every 200 ms for 20 s,
// busy ones first), while a producer pushes numbered messages to 8
// partitions and a WebSocket consumer acks each: nothing pushed is lost,
// no partition goes more than 5 s without a delivery while it has
// messages waiting, order holds per partition, and a message is delivered
// again, or with a retryCount, only when an ack of it failed.
func TestFailover_KilledConnectionsLoseAndStallNothing(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	app := "herald-" + queue.NewID()[:8]
	u, err := url.Parse(dsn)
	require.NoError(t, err, "pgtest gives a URL")
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	in := servertest.Start(t, u.String(), "notify", func(c *server.Config) {
		c.SweepMin, c.SweepMax = 0, 0 // the defaults, as deployed
	})

	const partitions = 8
	prod := servertest.StartProducer(t, []string{in.URL()}, "fo", partitions, 100)
	cons := servertest.StartConsumer(t, in.URL(), "fo", 10)

	// The killer's own connection is not Herald's: it is found by its
	// application_name.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	killer, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	require.NoError(t, err)
	defer func() { _ = killer.Close(context.Background()) }()

	// Traffic flows before the first cut: deliveries, not a span of time
	// (a busy machine may take seconds to start the producer).
	require.True(t, servertest.WaitFor(30*time.Second, nil, func() bool { return len(cons.Deliveries()) >= 50 }),
		"50 deliveries before the first cut")
	kills := 0
	end := time.Now().Add(20 * time.Second)
	pace := time.NewTicker(200 * time.Millisecond) // the fault injector's pace: a cut every 200 ms for 20 s
	defer pace.Stop()
	for ; time.Now().Before(end); <-pace.C {
		var n int
		require.NoError(t, killer.QueryRow(ctx, `
			SELECT count(pg_terminate_backend(pid)) FROM (
				SELECT pid FROM pg_stat_activity WHERE application_name = $1
				ORDER BY state = 'active' DESC, random() LIMIT 1) AS victim`, app).Scan(&n))
		kills += n
	}
	// Traffic flows after the last cut: a message pushed after it is
	// delivered.
	lastCut := time.Now()
	require.True(t, servertest.WaitFor(30*time.Second, nil, func() bool {
		return servertest.DeliveriesBack(prod, cons, lastCut) > 0
	}), "a message pushed after the last cut is delivered within 30 s")
	prod.Stop()

	conf := prod.Confirmed()
	done := servertest.WaitFor(30*time.Second, nil, func() bool {
		for k, n := range conf {
			for i := 1; i <= n; i++ {
				if !cons.Acked(k, i) {
					return false
				}
			}
		}
		return true
	})
	cons.Stop()
	r := servertest.Check(prod, cons, 5*time.Second, time.Now())
	fails, attempts := prod.Failures()
	t.Logf("%d connections killed; %d messages pushed (%d attempts, failed: %v); %d deliveries, %d charged; "+
		"ack retries %d, refusals %v; longest wait of a partition %v; duplicates %d",
		kills, r.Pushed, attempts, fails, len(cons.Deliveries()), r.Charged, r.AckRetries, r.Refusals,
		r.LongestGap.Round(time.Millisecond), len(r.Duplicates))
	require.Positive(t, kills, "the loop killed Herald's connections")
	assert.True(t, done, "every pushed message acknowledged within 30 s of the last push")
	assert.Empty(t, r.Lost, "lost")
	assert.Empty(t, r.Stalls, "stalls")
	assert.Empty(t, r.OutOfOrder, "order per partition")
	assert.Empty(t, r.Unexplained, "redeliveries and retryCounts no failed ack explains")
	assert.Empty(t, r.Refusals, "acks refused")
	if t.Failed() {
		dumpConsumers(ctx, t, killer, u.Query().Get("search_path"))
	}
}

// dumpConsumers logs the consumer rows of a schema, to tell a lease left
// in the database from state kept in memory.
func dumpConsumers(ctx context.Context, t *testing.T, conn *pgx.Conn, schema string) {
	rows, err := conn.Query(ctx, `SELECT p.name, c.cursor, p.last_offset, c.lease_id::text, c.lease_expires_at - now(), c.done::text
		FROM `+pgx.Identifier{schema, "consumers"}.Sanitize()+` c JOIN `+pgx.Identifier{schema, "partitions"}.Sanitize()+
		` p ON p.id = c.partition_id ORDER BY p.name`)
	if err != nil {
		t.Logf("reading consumers: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var cursor, last int64
		var lease, done *string
		var left *time.Duration
		if err := rows.Scan(&name, &cursor, &last, &lease, &left, &done); err != nil {
			t.Logf("reading consumers: %v", err)
			return
		}
		t.Logf("partition %s: cursor %d of %d, lease %v (expires in %v), done %v", name, cursor, last, deref(lease), deref(left), deref(done))
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
