//go:build reliability

package reliability

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
)

// Failover to a streaming standby, as an operator runs it: a primary and
// a pg_basebackup -R standby (synchronous, or not), two Herald instances
// on a multi-host URL with target_session_attrs=read-write, 200 numbered
// pushes a second over 8 partitions through both, and a WebSocket consumer
// acking each. The primary's postmaster is killed with SIGKILL and the
// standby promoted. The asynchronous standby stops receiving a second
// before the kill (as one lagging that much behind a busy primary): what
// the primary committed in its last second is certainly lost, pushes
// answered 201, pops that leased and delivered, acks that ended leases.
// Either way: what the promoted database has is delivered, nothing twice
// but what an ack that failed or may be gone explains, with no retryCount;
// order holds per partition; no partition waits more than 5 s for a
// delivery (the leases that came back with the lost acks are given back,
// and the deliveries whose pops were lost are forgotten); and the time from
// the kill to pushes and to deliveries back is measured.
func TestStandby_PrimaryKilledStandbyPromoted(t *testing.T) {
	for _, sync := range []bool{true, false} {
		name := map[bool]string{true: "Sync", false: "Async"}[sync]
		t.Run(name, func(t *testing.T) {
			pair := newStandbyPair(t, sync)
			run := startFailoverTraffic(t, pair)
			run.flowing(t)
			var loss servertest.Loss
			if !sync {
				loss.AckedFrom = pair.stopStreaming(t)
				// Traffic the standby does not get: 200 deliveries (a second at 200 pushes a second).
				after := len(run.cons.Deliveries()) + 200
				require.True(t, servertest.WaitFor(30*time.Second, nil, func() bool { return len(run.cons.Deliveries()) >= after }),
					"200 deliveries the standby did not stream")
			}
			pid := pair.primary.postmasterPID(t)
			killAt := time.Now()
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			pair.standby.pgctl(t, "promote", "-w")
			promoted := time.Since(killAt)
			run.flowingAgain(t, killAt)
			r := run.finishLoss(t, killAt, pair.standby, loss)
			t.Logf("%s: kill → promoted %v, → pushes back %v, → deliveries back %v; lost %d, gone with the primary %d, "+
				"duplicates %d, charged %d, stalls %d, longest wait %v, ack retries %d", name,
				promoted.Round(time.Millisecond), r.pushesBack.Round(time.Millisecond),
				r.deliveriesBack.Round(time.Millisecond), len(r.Lost), r.gone, len(r.Duplicates), r.Charged,
				len(r.Stalls), r.LongestGap.Round(time.Millisecond), r.AckRetries)
			assert.Empty(t, r.Lost, "what the promoted database has, never delivered")
			if sync {
				assert.Zero(t, r.gone, "lost with synchronous replication")
			} else {
				assert.Positive(t, r.gone, "the primary's last second was not streamed: its pushes are gone")
			}
			assert.Empty(t, r.Unexplained, "deliveries again or charged with no failed (or lost) ack to explain them")
			assert.Zero(t, r.Charged, "deliveries with a retryCount")
			assert.Empty(t, r.OutOfOrder, "order per partition")
			assert.Empty(t, r.Stalls, "partitions that waited more than 5 s for a delivery")
			assert.Positive(t, r.pushesBack, "pushes came back")
			assert.Positive(t, r.deliveriesBack, "deliveries came back")
		})
	}
}

// stopStreaming makes the standby stop receiving from the primary, once
// it has received everything committed so far: it returns when it began
// (what was answered before that is on the standby) and once the standby's
// WAL receiver is gone.
func (sp *standbyPair) stopStreaming(t *testing.T) time.Time {
	from := time.Now()
	lsn := sp.primary.query(t, "SELECT pg_current_wal_lsn()::text")
	require.True(t, servertest.WaitFor(10*time.Second, nil, func() bool {
		return sp.standby.query(t, "SELECT (pg_last_wal_receive_lsn() >= '"+lsn+"'::pg_lsn)::text") == "true"
	}), "the standby receives up to %s", lsn)
	sp.standby.exec(t, "ALTER SYSTEM SET primary_conninfo = ''")
	sp.standby.exec(t, "SELECT pg_reload_conf()")
	require.True(t, servertest.WaitFor(10*time.Second, nil, func() bool {
		return sp.standby.query(t, "SELECT count(*)::text FROM pg_stat_wal_receiver") == "0"
	}), "the standby's WAL receiver stops")
	return from
}

// A hung primary (its postmaster and backends stopped with SIGSTOP, as a
// host that stopped answering) is left for the promoted standby within
// 10 s: pushes come back, and /health agrees with them.
func TestStandby_PrimaryHungStandbyPromoted(t *testing.T) {
	pair := newStandbyPair(t, true)
	run := startFailoverTraffic(t, pair)
	run.flowing(t)
	pids := pair.primary.processes(t)
	freezeAt := time.Now()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	// /health of each instance, sampled every 100 ms for 20 s.
	healthBack := make([]time.Duration, len(run.instances))
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		lastBad := make([]time.Time, len(run.instances))
		firstOK := make([]time.Time, len(run.instances))
		client := &http.Client{Timeout: time.Second}
		pace := time.NewTicker(100 * time.Millisecond) // the sampler's pace: /health every 100 ms for 20 s
		defer pace.Stop()
		for ; time.Since(freezeAt) < 20*time.Second; <-pace.C {
			for i, in := range run.instances {
				ok := false
				if res, err := client.Get(in.URL() + "/health"); err == nil {
					ok = res.StatusCode == http.StatusOK
					_ = res.Body.Close()
				}
				switch {
				case !ok:
					lastBad[i], firstOK[i] = time.Now(), time.Time{}
				case firstOK[i].IsZero():
					firstOK[i] = time.Now()
				}
			}
		}
		for i := range healthBack {
			healthBack[i] = firstOK[i].Sub(freezeAt)
			if firstOK[i].IsZero() {
				healthBack[i] = -1
			}
		}
	}()
	pair.standby.pgctl(t, "promote", "-w")
	<-sampled
	r := run.finishLoss(t, freezeAt, pair.standby, servertest.Loss{})
	t.Logf("hung primary: freeze → pushes back %v, → deliveries back %v, /health 200 on the instances by %v; "+
		"lost %d, duplicates %d, charged %d, stalls %d, ack retries %d", r.pushesBack.Round(time.Millisecond),
		r.deliveriesBack.Round(time.Millisecond), healthBack, len(r.Lost), len(r.Duplicates), r.Charged, len(r.Stalls),
		r.AckRetries)
	assert.Empty(t, r.Lost, "lost with synchronous replication")
	assert.Empty(t, r.Unexplained, "deliveries again or charged with no failed ack to explain them")
	assert.Empty(t, r.OutOfOrder, "order per partition")
	assert.Positive(t, r.pushesBack)
	assert.Less(t, r.pushesBack, 10*time.Second, "pushes back within 10 s of the freeze")
	assert.Positive(t, r.deliveriesBack)
	assert.Less(t, r.deliveriesBack, 10*time.Second, "deliveries back within 10 s of the freeze")
	for i, d := range healthBack {
		assert.True(t, d > 0 && d < 10*time.Second, "instance %d: /health 200 for good within 10 s of the freeze (%v)", i, d)
	}
}

// failoverTraffic is two instances, a producer through both and a
// consumer on the second.
type failoverTraffic struct {
	instances []*servertest.Instance
	prod      *servertest.Producer
	cons      *servertest.Consumer
}

func startFailoverTraffic(t *testing.T, pair *standbyPair) *failoverTraffic {
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/herald?sslmode=disable&target_session_attrs=read-write",
		pair.primary.port, pair.standby.port)
	var ft failoverTraffic
	for i := range 2 {
		ft.instances = append(ft.instances, servertest.Start(t, dsn, "notify", func(c *server.Config) {
			c.SweepMin, c.SweepMax = 0, 0 // the defaults, as deployed
			// What the instances say of the database changing under them.
			c.Logger = zerolog.New(logLines{t: t, prefix: fmt.Sprintf("instance %d: ", i), only: []string{
				"not the one the lock was held on", "reconcil"}})
		}))
	}
	ft.prod = servertest.StartProducer(t, []string{ft.instances[0].URL(), ft.instances[1].URL()}, "ha", 8, 200)
	ft.cons = servertest.StartConsumer(t, ft.instances[1].URL(), "ha", 10)
	return &ft
}

// logLines passes the log lines that contain one of only to t.Log.
type logLines struct {
	t      *testing.T
	prefix string
	only   []string
}

func (l logLines) Write(p []byte) (int, error) {
	for _, o := range l.only {
		if strings.Contains(string(p), o) {
			l.t.Log(l.prefix + strings.TrimSpace(string(p)))
			break
		}
	}
	return len(p), nil
}

// flowing waits until traffic flows before a fault: 1,000 deliveries
// (5 s at 200 pushes a second), not a span of time (a busy machine may
// take longer to start the producer).
func (ft *failoverTraffic) flowing(t *testing.T) {
	t.Helper()
	require.True(t, servertest.WaitFor(60*time.Second, nil, func() bool { return len(ft.cons.Deliveries()) >= 1000 }),
		"1,000 deliveries before the fault")
}

// flowingAgain waits until traffic flows after the fault at faultAt: a
// message pushed after it is delivered, then 3,000 more deliveries (15 s
// at 200 pushes a second) run through the promoted standby.
func (ft *failoverTraffic) flowingAgain(t *testing.T, faultAt time.Time) {
	t.Helper()
	require.True(t, servertest.WaitFor(60*time.Second, nil, func() bool {
		return servertest.DeliveriesBack(ft.prod, ft.cons, faultAt) > 0
	}), "a message pushed after the fault is delivered within 60 s")
	after := len(ft.cons.Deliveries()) + 3000
	require.True(t, servertest.WaitFor(60*time.Second, nil, func() bool { return len(ft.cons.Deliveries()) >= after }),
		"3,000 deliveries after the fault")
}

type failoverReport struct {
	servertest.Report
	pushesBack, deliveriesBack time.Duration
	gone                       int // answered 201, not in the promoted database
}

// finishLoss stops the producer, waits for every pushed message that the
// database now serving (db) has to be acked, and checks the run; the
// messages db does not have are gone with the old primary (loss.Gone).
func (ft *failoverTraffic) finishLoss(t *testing.T, faultAt time.Time, db *pgInstance,
	loss servertest.Loss) failoverReport {
	ft.prod.Stop()
	conf := ft.prod.Confirmed()
	stored := db.stored(t, "ha")
	loss.Gone = func(k, n int) bool { return !stored[[2]int{k, n}] }
	servertest.WaitFor(30*time.Second, nil, func() bool {
		for k, n := range conf {
			for i := 1; i <= n; i++ {
				if stored[[2]int{k, i}] && !ft.cons.Acked(k, i) {
					return false
				}
			}
		}
		return true
	})
	ft.cons.Stop()
	r := failoverReport{Report: servertest.CheckLoss(ft.prod, ft.cons, 5*time.Second, time.Now(), loss)}
	for k, n := range conf {
		for i := 1; i <= n; i++ {
			if !stored[[2]int{k, i}] {
				r.gone++
			}
		}
	}
	if len(r.Stalls) > 0 {
		t.Logf("the consumer rows of the database now serving: %s", db.query(t, `SELECT coalesce(string_agg(format('%s cursor %s lease %s owner %s expires in %s',
			p.name, c.cursor, c.lease_id, c.lease_owner, c.lease_expires_at - now()), '; ' ORDER BY p.name), '')
			FROM herald.consumers c JOIN herald.partitions p ON p.id = c.partition_id`))
	}
	r.pushesBack = ft.prod.PushesBack(faultAt)
	r.deliveriesBack = servertest.DeliveriesBack(ft.prod, ft.cons, faultAt)
	fails, attempts := ft.prod.Failures()
	t.Logf("%d messages pushed in %d attempts (failed: %v); refusals %v", r.Pushed, attempts, fails, r.Refusals)
	return r
}

// pgInstance is one PostgreSQL server of the pair, run as the postgres user.
type pgInstance struct {
	dir  string // PGDATA
	port int
}

type standbyPair struct{ primary, standby *pgInstance }

const pgBin = "/usr/lib/postgresql/15/bin"

// newStandbyPair makes a primary with database herald and a streaming
// standby of it (pg_basebackup -R); sync makes the standby synchronous.
func newStandbyPair(t *testing.T, sync bool) *standbyPair {
	base, err := os.MkdirTemp("", "herald-standby-")
	require.NoError(t, err)
	pg, err := user.Lookup("postgres")
	require.NoError(t, err, "the postgres user runs the servers (initdb refuses root)")
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	require.NoError(t, os.Chown(base, uid, gid))
	t.Cleanup(func() { _ = os.RemoveAll(base) })

	p := &pgInstance{dir: filepath.Join(base, "primary"), port: freePort(t, "tcp")}
	s := &pgInstance{dir: filepath.Join(base, "standby"), port: freePort(t, "tcp")}
	runAs(t, filepath.Join(pgBin, "initdb"), "-D", p.dir, "-U", "postgres", "--auth=trust", "-N")
	conf := "listen_addresses = '127.0.0.1'\nunix_socket_directories = '" + base + "'\nfsync = off\n" +
		"wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\nmax_connections = 200\n"
	require.NoError(t, os.WriteFile(filepath.Join(p.dir, "postgresql.auto.conf"), []byte(conf), 0o600))
	require.NoError(t, os.Chown(filepath.Join(p.dir, "postgresql.auto.conf"), uid, gid))
	p.start(t)
	p.exec(t, "CREATE DATABASE herald")
	runAs(t, filepath.Join(pgBin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "-c", "fast")
	s.start(t)
	if sync {
		p.exec(t, "ALTER SYSTEM SET synchronous_standby_names = '*'")
		p.exec(t, "SELECT pg_reload_conf()")
	}
	// The standby streams (and, sync, is the synchronous one) before Herald starts.
	want := map[bool]string{true: "sync", false: "async"}[sync]
	require.True(t, servertest.WaitFor(30*time.Second, nil, func() bool {
		return p.query(t, "SELECT coalesce((SELECT sync_state FROM pg_stat_replication LIMIT 1), '')") == want
	}), "the standby streams as %s", want)
	return &standbyPair{primary: p, standby: s}
}

func (pi *pgInstance) start(t *testing.T) {
	runAs(t, filepath.Join(pgBin, "pg_ctl"), "-D", pi.dir, "-l", pi.dir+".log", "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d", pi.port), "start")
	t.Cleanup(func() {
		cmd := exec.Command("runuser", "-u", "postgres", "--", filepath.Join(pgBin, "pg_ctl"), "-D", pi.dir, "-m",
			"immediate", "stop")
		_ = cmd.Run()
	})
}

func (pi *pgInstance) pgctl(t *testing.T, args ...string) {
	runAs(t, filepath.Join(pgBin, "pg_ctl"), append([]string{"-D", pi.dir}, args...)...)
}

func (pi *pgInstance) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/herald?sslmode=disable", pi.port)
}

func (pi *pgInstance) exec(t *testing.T, sql string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, strings.Replace(pi.url(), "/herald?", "/postgres?", 1))
	require.NoError(t, err)
	defer func() { _ = c.Close(context.Background()) }()
	_, err = c.Exec(ctx, sql)
	require.NoError(t, err, sql)
}

func (pi *pgInstance) query(t *testing.T, sql string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := "/postgres?"
	if strings.Contains(sql, "herald.") {
		db = "/herald?"
	}
	c, err := pgx.Connect(ctx, strings.Replace(pi.url(), "/herald?", db, 1))
	require.NoError(t, err)
	defer func() { _ = c.Close(context.Background()) }()
	var out string
	require.NoError(t, c.QueryRow(ctx, sql).Scan(&out))
	return out
}

// stored is the {"p","n"} of every message of queue q in the database.
func (pi *pgInstance) stored(t *testing.T, q string) map[[2]int]bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pi.url())
	require.NoError(t, err)
	defer func() { _ = c.Close(context.Background()) }()
	rows, err := c.Query(ctx, `SELECT (m.payload->>'p')::int, (m.payload->>'n')::int
		FROM herald.messages m JOIN herald.partitions p ON p.id = m.partition_id JOIN herald.queues q ON q.id = p.queue_id
		WHERE q.name = $1`, q)
	require.NoError(t, err)
	out := map[[2]int]bool{}
	for rows.Next() {
		var k, n int
		require.NoError(t, rows.Scan(&k, &n))
		out[[2]int{k, n}] = true
	}
	require.NoError(t, rows.Err())
	return out
}

// postmasterPID reads the first line of postmaster.pid.
func (pi *pgInstance) postmasterPID(t *testing.T) int {
	b, err := os.ReadFile(filepath.Join(pi.dir, "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	require.NoError(t, err)
	return pid
}

// processes are the postmaster and its children.
func (pi *pgInstance) processes(t *testing.T) []int {
	pm := pi.postmasterPID(t)
	pids := []int{pm}
	out, err := exec.Command("pgrep", "-P", strconv.Itoa(pm)).Output()
	require.NoError(t, err)
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func runAs(t *testing.T, bin string, args ...string) {
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v: %s", bin, args, out)
}
