package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/benchstat"
)

// The groups scenario: consumer groups that come and go (browser tabs each
// in a group of its own).
//   - push cost: single-message pushes to a queue that 0, 1,000 and 10,000
//     groups read once and left, over HTTP and, with a database, through
//     the push SQL function (SQL producers); p50, p99 and, with a
//     database, the WAL each push writes (pg_current_wal_lsn before and
//     after);
//   - burst: 1,000 WebSocket subscriptions, each a new group
//     (subscriptionMode=new), opened within about a second, then one push:
//     how long until every one of them has it;
//   - autoAck: push → receipt for one WebSocket subscription at 200 msgs/s,
//     autoAck and manual ack, side by side (both get the push hand-off).

// groupsPushCost is the push cost with idle groups on the queue.
type groupsPushCost struct {
	IdleGroups int     `json:"idle_groups"`
	Via        string  `json:"via"` // "http" or "sql" (the push SQL function)
	Pushes     int     `json:"pushes"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	WALPerPush float64 `json:"wal_bytes_per_push"` // 0 without --dsn
}

// groupsBurst is the registration burst.
type groupsBurst struct {
	Groups       int     `json:"groups"`
	SubscribeSec float64 `json:"subscribe_s"` // opening every subscription
	Served       int     `json:"served"`
	ServedSec    float64 `json:"served_s"` // from the push to the last receipt
}

// groupsResult is the groups scenario.
type groupsResult struct {
	PushCost []groupsPushCost `json:"push_cost"`
	Burst    *groupsBurst     `json:"burst,omitempty"`
	AutoAck  []latencyResult  `json:"auto_ack,omitempty"`
}

const (
	groupsPushes    = 300
	groupsBurstSize = 1000
	groupsRate      = 200
)

func runGroups(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) (*groupsResult, error) {
	out := &groupsResult{}
	var db *pgx.Conn
	dsn := cfg.DSN
	if dsn == "" {
		dsn = srv.pgDSN() // the private PostgreSQL of a server it started
	}
	if dsn != "" {
		var err error
		if db, err = pgx.Connect(ctx, dsn); err != nil {
			progress(log, "groups: no WAL measurement: %v", err)
			db = nil
		} else {
			defer func() { _ = db.Close(context.Background()) }()
		}
	}
	for _, n := range []int{0, 1000, 10000} {
		progress(log, "groups: %d groups read a queue once and leave", n)
		rs, err := pushCost(ctx, srv.url, db, n)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			progress(log, "groups: %d idle groups, %s push: p50 %.2f ms, p99 %.2f ms, WAL %.0f B/push", n, r.Via, r.P50, r.P99, r.WALPerPush)
		}
		out.PushCost = append(out.PushCost, rs...)
	}
	progress(log, "groups: %d new groups subscribe, then one push", groupsBurstSize)
	b, err := burst(ctx, srv.url, groupsBurstSize)
	if err != nil {
		return nil, err
	}
	progress(log, "groups: %d/%d served %.2f s after the push (subscribing took %.2f s)", b.Served, b.Groups, b.ServedSec, b.SubscribeSec)
	out.Burst = b
	for _, auto := range []bool{false, true} {
		r, err := autoAckLatency(ctx, srv.url, cfg, auto)
		if err != nil {
			return nil, err
		}
		progress(log, "groups: ws %s at %d msgs/s: p50 %.2f ms, p99 %.2f ms (%d/%d)", r.Ack, groupsRate, r.P50, r.P99, r.Received, r.Pushed)
		out.AutoAck = append(out.AutoAck, r)
	}
	return out, nil
}

// pushCost makes n groups read queue q once (an autoAck pop each) and
// leave, then measures groupsPushes single-message pushes over HTTP and,
// with db, as many through the push SQL function.
func pushCost(ctx context.Context, base string, db *pgx.Conn, n int) ([]groupsPushCost, error) {
	q := fmt.Sprintf("bench-groups-%d-%d", n, time.Now().UnixNano())
	push := func() error {
		return post(ctx, base+"/api/v1/push", fmt.Sprintf(`{"items":[{"queue":%q,"payload":{"t":1}}]}`, q), http.StatusCreated)
	}
	if err := push(); err != nil {
		return nil, err
	}
	readers := benchstat.NewPool(ctx, 32, 0, func(ctx context.Context, g int) error {
		u := fmt.Sprintf("%s/api/v1/pop/queue/%s?consumerGroup=tab%05d&autoAck=true&wait=false", base, url.PathEscape(q), g)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		res, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return nil
	})
	for g := range n {
		readers.Feed(g)
	}
	if err := readers.Wait(); err != nil {
		return nil, err
	}
	if err := push(); err != nil { // the push after they left
		return nil, err
	}
	lsn := func() int64 {
		var v int64
		if db != nil {
			_ = db.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&v)
		}
		return v
	}
	measure := func(via string, push func() error) (groupsPushCost, error) {
		wal0 := lsn()
		lats := make([]time.Duration, 0, groupsPushes)
		for range groupsPushes {
			t0 := time.Now()
			if err := push(); err != nil {
				return groupsPushCost{}, fmt.Errorf("%s push: %w", via, err)
			}
			lats = append(lats, time.Since(t0))
		}
		wal1 := lsn()
		slices.Sort(lats)
		l := benchstat.Latencies{Sorted: lats}
		return groupsPushCost{IdleGroups: n, Via: via, Pushes: groupsPushes, P50: l.Ms(50), P99: l.Ms(99), WALPerPush: float64(wal1-wal0) / groupsPushes}, nil
	}
	r, err := measure("http", push)
	if err != nil || db == nil {
		return []groupsPushCost{r}, err
	}
	fn, err := pushFunction(ctx, db)
	if err != nil {
		return nil, err
	}
	rs, err := measure("sql", func() error {
		_, err := db.Exec(ctx, `SELECT `+fn+`($1, NULL, '{"t":1}'::jsonb, NULL)`, q)
		return err
	})
	return []groupsPushCost{r, rs}, err
}

// pushFunction is the qualified name of Herald's push SQL function in the
// database db reaches (the schema Herald migrated: "herald" by default).
func pushFunction(ctx context.Context, db *pgx.Conn) (string, error) {
	var schema string
	if err := db.QueryRow(ctx, `SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'herald_migrations'
		WHERE p.proname = 'push' ORDER BY n.nspname = 'herald' DESC LIMIT 1`).Scan(&schema); err != nil {
		return "", fmt.Errorf("finding the push SQL function: %w", err)
	}
	return pgx.Identifier{schema, "push"}.Sanitize(), nil
}

// burst opens n WebSocket subscriptions, each a new group, as fast as it
// can, pushes one message, and times until every subscription has it.
func burst(ctx context.Context, base string, n int) (*groupsBurst, error) {
	q := fmt.Sprintf("bench-burst-%d", time.Now().UnixNano())
	if err := post(ctx, base+"/api/v1/push", fmt.Sprintf(`{"items":[{"queue":%q,"payload":{"old":true}}]}`, q), http.StatusCreated); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var served atomic.Int64
	var last atomic.Int64
	all := make(chan struct{})
	var wg sync.WaitGroup
	var open sync.WaitGroup
	start := time.Now()
	sem := make(chan struct{}, 64)
	for g := range n {
		open.Add(1)
		wg.Go(func() {
			sem <- struct{}{}
			c, err := client.Dial(cctx, base, client.Options{})
			<-sem
			open.Done()
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			_ = c.Subscribe(cctx, client.SubscribeOptions{Queue: q, ConsumerGroup: fmt.Sprintf("tab%05d", g),
				SubscriptionMode: "new", AutoAck: true},
				func(context.Context, *client.Message) error {
					last.Store(time.Now().UnixNano())
					if served.Add(1) == int64(n) {
						close(all)
					}
					return nil
				})
		})
	}
	open.Wait()
	subscribed := time.Since(start)
	// The subscribe frames are on their way: give them the second they are
	// allowed, then push.
	select {
	case <-time.After(max(0, time.Second-subscribed)):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pushed := time.Now()
	if err := post(ctx, base+"/api/v1/push", fmt.Sprintf(`{"items":[{"queue":%q,"payload":{"new":true}}]}`, q), http.StatusCreated); err != nil {
		return nil, err
	}
	select {
	case <-all:
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	res := &groupsBurst{Groups: n, SubscribeSec: subscribed.Seconds(), Served: int(served.Load())}
	if l := last.Load(); l > 0 {
		res.ServedSec = time.Unix(0, l).Sub(pushed).Seconds()
	}
	return res, nil
}

// autoAckLatency is push → receipt for one WebSocket subscription at
// groupsRate msgs/s, with autoAck or acking each message.
func autoAckLatency(ctx context.Context, base string, cfg benchConfig, auto bool) (latencyResult, error) {
	q := fmt.Sprintf("bench-autoack-%v-%d", auto, time.Now().UnixNano())
	total := int(float64(groupsRate) * cfg.Duration.Seconds())
	rec := benchstat.NewRecorder(0, 2*groupsRate)
	res := latencyResult{Setup: "1 instance", Transport: "ws", Rate: groupsRate, Ack: "manual ack (SDK)"}
	if auto {
		res.Ack = "autoAck"
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := client.Dial(cctx, base, client.Options{})
		close(ready)
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		_ = c.Subscribe(cctx, client.SubscribeOptions{Queue: q, Batch: 100, MaxInFlight: 1000, AutoAck: auto},
			func(_ context.Context, m *client.Message) error {
				rec.RecordJSON(m.Data, time.Now())
				return nil
			})
	})
	<-ready
	time.Sleep(200 * time.Millisecond) // the subscribe frame, before the first push
	sent, err := pace(ctx, base, q, groupsRate, total, latencyPartitions)
	if err != nil {
		return res, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for rec.Count() < sent && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	l := rec.Latencies()
	res.Pushed, res.Received, res.Duplicates = sent, l.Received, l.Duplicates
	res.P50, res.P90, res.P99, res.P999, res.Max = l.Ms(50), l.Ms(90), l.Ms(99), l.Ms(99.9), l.Ms(100)
	return res, nil
}

// printGroups writes the groups scenario's tables.
func printGroups(w io.Writer, g *groupsResult) {
	fmt.Fprintln(w, "\nconsumer groups that come and go")
	for _, c := range g.PushCost {
		fmt.Fprintf(w, "  %6d idle groups, %-4s push: p50 %.2f ms, p99 %.2f ms, WAL %.0f B/push (%d pushes)\n",
			c.IdleGroups, c.Via, c.P50, c.P99, c.WALPerPush, c.Pushes)
	}
	if b := g.Burst; b != nil {
		fmt.Fprintf(w, "  %d new groups (subscribed in %.2f s): %d served %.2f s after the push\n",
			b.Groups, b.SubscribeSec, b.Served, b.ServedSec)
	}
	for _, l := range g.AutoAck {
		fmt.Fprintf(w, "  ws %s at %d msgs/s: p50 %.2f ms, p99 %.2f ms, %d/%d received\n", l.Ack, l.Rate, l.P50, l.P99, l.Received, l.Pushed)
	}
}
