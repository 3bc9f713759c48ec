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

	"github.com/heraldmq/herald/internal/benchstat"
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
	e2eCur atomic.Pointer[riverE2ERun]
	n      int
	wg     sync.WaitGroup
}

type riverRun struct {
	id  string
	rec *benchstat.Recorder
}

// riverE2EQueue is the queue of the end-to-end jobs, worked by
// riverE2EWorkers workers (the latency jobs keep River's default 100).
const (
	riverE2EQueue   = "e2e"
	riverE2EWorkers = 1000
)

// riverE2EArgs is an end-to-end job: one message, counted by the worker
// child, which prints "c RUN N" (N jobs of RUN done) every 10 ms instead of
// a line per job.
type riverE2EArgs struct {
	Run string `json:"run"`
	I   int    `json:"i"`
	P   string `json:"p"`
}

func (riverE2EArgs) Kind() string { return "peers-e2e" }

func (riverE2EArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: riverE2EQueue} }

type riverE2ERun struct {
	id string
	g  *e2eGroup
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
		if len(f) == 3 && f[0] == "c" {
			if e := s.e2eCur.Load(); e != nil && f[1] == e.id {
				n, _ := strconv.ParseInt(f[2], 10, 64)
				e.g.n.Store(n)
			}
			continue
		}
		r := s.cur.Load()
		if len(f) != 4 || r == nil || f[0] != r.id {
			continue
		}
		i, _ := strconv.Atoi(f[1])
		t, _ := strconv.ParseInt(f[2], 10, 64)
		now, _ := strconv.ParseInt(f[3], 10, 64)
		r.rec.Record(i, t, time.Unix(0, now))
	}
}

func (s *riverSys) name() string { return "river" }

func (s *riverSys) cpu() (time.Duration, time.Duration) { return procCPU(s.ch.pid()), s.pg.cpu() }

func (s *riverSys) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	s.n++
	r := &riverRun{id: fmt.Sprintf("r%d-%d", rate, s.n), rec: benchstat.NewRecorder(runLength(rate, warm, dur))}
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

// River has no consumer groups: a job is worked once.
func (s *riverSys) e2eMaxGroups() int { return 1 }

// e2e inserts each batch with one InsertMany; riverE2EWorkers workers in
// the child complete the jobs.
func (s *riverSys) e2e(ctx context.Context, groups int, warm, dur time.Duration) (e2eSample, error) {
	if groups != 1 {
		return e2eSample{}, fmt.Errorf("river has no consumer groups")
	}
	s.n++
	r := newE2ERun(1)
	e := &riverE2ERun{id: fmt.Sprintf("e%d", s.n), g: r.groups[0]}
	s.e2eCur.Store(e)
	defer s.e2eCur.Store(nil)
	sm, err := measureE2E(ctx, r, warm, dur, s.cpu, func(ctx context.Context, first int, ps [][]byte) error {
		params := make([]river.InsertManyParams, len(ps))
		for k := range ps {
			a := riverE2EArgs{Run: e.id, I: first + k}
			// The same 100 bytes of JSON args as the others' payloads.
			if b, err := json.Marshal(a); err == nil {
				a.P = strings.Repeat("x", max(0, payloadSize-len(b)))
			}
			params[k] = river.InsertManyParams{Args: a}
		}
		_, err := s.client.InsertMany(ctx, params)
		return err
	})
	// Each run starts from an empty job table, as the NATS runs start from
	// a new stream (River would keep completed jobs for a day).
	if _, derr := s.pool.Exec(ctx, "DELETE FROM river_job WHERE kind = 'peers-e2e' AND state = 'completed'"); derr != nil &&
		err == nil {
		err = fmt.Errorf("deleting the completed jobs: %w", derr)
	}
	return sm, err
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

// riverE2EWorker counts the end-to-end jobs per run; report prints the
// counts.
type riverE2EWorker struct {
	river.WorkerDefaults[riverE2EArgs]
	runs sync.Map // run id → *atomic.Int64
}

func (w *riverE2EWorker) Work(_ context.Context, j *river.Job[riverE2EArgs]) error {
	n, _ := w.runs.LoadOrStore(j.Args.Run, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	return nil
}

// report prints "c RUN N" for every run whose count changed, every 10 ms,
// until ctx ends.
func (w *riverE2EWorker) report(ctx context.Context, out *bufio.Writer, mu *sync.Mutex) {
	last := map[string]int64{}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		mu.Lock()
		w.runs.Range(func(k, v any) bool {
			if n := v.(*atomic.Int64).Load(); n != last[k.(string)] {
				last[k.(string)] = n
				fmt.Fprintf(out, "c %s %d\n", k, n)
			}
			return true
		})
		_ = out.Flush()
		mu.Unlock()
	}
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
	lat := &riverWorker{out: bufio.NewWriter(os.Stdout)}
	river.AddWorker(workers, lat)
	e2e := &riverE2EWorker{}
	river.AddWorker(workers, e2e)
	cl, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100},
			riverE2EQueue: {MaxWorkers: riverE2EWorkers}},
		Workers: workers,
	})
	if err != nil {
		return fmt.Errorf("creating River's client: %w", err)
	}
	if err := cl.Start(ctx); err != nil {
		return fmt.Errorf("starting River's client: %w", err)
	}
	fmt.Println("ready -")
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { e2e.report(rctx, lat.out, &lat.mu) })
	waitParent()
	stop()
	wg.Wait()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cl.Stop(sctx)
}
