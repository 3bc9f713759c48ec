package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverArgs is a River job: one message.
type riverArgs struct {
	Run string `json:"run"` // the measurement it belongs to
	T   int64  `json:"t"`
	I   int    `json:"i"`
	P   string `json:"p"`
}

func (riverArgs) Kind() string { return "peers" }

// riverSys is River on the run's PostgreSQL: pushes are Client.Insert from
// this process (an insert-only client), the worker is a River client in a
// child process (its defaults: 100 workers, LISTEN/NOTIFY plus polling) and
// a job that returns nil is completed, River's ack. The child reports each
// job on its stdout.
type riverSys struct {
	ch     *child
	pg     *postgres
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
	cur    atomic.Pointer[riverRun]
	n      int
	wg     sync.WaitGroup
}

type riverRun struct {
	id  string
	rec *recorder
}

func startRiver(ctx context.Context, self string, pg *postgres) (*riverSys, error) {
	pool, err := pgxpool.New(ctx, pg.url("river"))
	if err != nil {
		return nil, fmt.Errorf("connecting to the river database: %w", err)
	}
	mig, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("preparing River's migrations: %w", err)
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrating River's schema: %w", err)
	}
	cl, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("creating River's insert client: %w", err)
	}
	ch, err := startChild(ctx, self, "child", "river", pg.url("river"))
	if err != nil {
		pool.Close()
		return nil, err
	}
	s := &riverSys{ch: ch, pg: pg, pool: pool, client: cl}
	s.wg.Go(s.read)
	return s, nil
}

// read dispatches the child's "run i t now" lines to the current run.
func (s *riverSys) read() {
	for s.ch.lines.Scan() {
		f := strings.Fields(s.ch.lines.Text())
		r := s.cur.Load()
		if len(f) != 4 || r == nil || f[0] != r.id {
			continue
		}
		i, _ := strconv.Atoi(f[1])
		t, _ := strconv.ParseInt(f[2], 10, 64)
		now, _ := strconv.ParseInt(f[3], 10, 64)
		r.rec.record(i, t, time.Unix(0, now))
	}
}

func (s *riverSys) name() string { return "river" }

func (s *riverSys) cpu() (time.Duration, time.Duration) { return procCPU(s.ch.pid()), s.pg.cpu() }

func (s *riverSys) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	s.n++
	r := &riverRun{id: fmt.Sprintf("r%d-%d", rate, s.n), rec: newRecorder(runLength(rate, warm, dur))}
	s.cur.Store(r)
	defer s.cur.Store(nil)
	return measure(ctx, rate, warm, dur, s.cpu, r.rec, func(ctx context.Context, i int, _ []byte) error {
		a := riverArgs{Run: r.id, T: time.Now().UnixNano(), I: i}
		// The same 100 bytes of JSON args as the others' payloads.
		if b, err := json.Marshal(a); err == nil {
			a.P = strings.Repeat("x", max(0, payloadSize-len(b)))
		}
		_, err := s.client.Insert(ctx, a, nil)
		return err
	})
}

func (s *riverSys) close() {
	s.ch.stop()
	s.wg.Wait()
	s.pool.Close()
}

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	mu  sync.Mutex
	out *bufio.Writer
}

func (w *riverWorker) Work(_ context.Context, j *river.Job[riverArgs]) error {
	now := time.Now().UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(w.out, "%s %d %d %d\n", j.Args.Run, j.Args.I, j.Args.T, now)
	return w.out.Flush()
}

// childRiver runs River's worker client against the database URL in args.
func childRiver(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("child river: want a database URL")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return fmt.Errorf("connecting to the river database: %w", err)
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{out: bufio.NewWriter(os.Stdout)})
	cl, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers: workers,
	})
	if err != nil {
		return fmt.Errorf("creating River's client: %w", err)
	}
	if err := cl.Start(ctx); err != nil {
		return fmt.Errorf("starting River's client: %w", err)
	}
	fmt.Println("ready -")
	waitParent()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cl.Stop(sctx)
}
