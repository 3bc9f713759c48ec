package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/fanoutload"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue/queuetest"
)

func TestMain(m *testing.M) {
	// The idle and connections scenarios run this binary as their
	// connection holders, as herald-bench runs itself.
	if len(os.Args) > 1 && os.Args[1] == holderCmd {
		os.Exit(runHolder(os.Args[2:]))
	}
	pgtest.Main(m)
}

// testServer is a real gateway and poller on the test database, with its
// metrics (the scenarios read /metrics); it stops when the test ends.
func testServer(t *testing.T) *server {
	t.Helper()
	store := queuetest.NewStore(t)
	reg := prometheus.NewRegistry()
	p, err := poller.New(poller.Config{Store: store, Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(p.Start())
	gw, err := gateway.New(gateway.Config{Store: store, Poller: p, Registry: reg})
	require.NoError(t, err)
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		gw.Drain()
		ts.Close()
		gw.Close()
	})
	return &server{url: ts.URL}
}

// The bench itself, end to end against a real server at a low rate: every
// transport receives every message once.
func TestLatencyAndThroughputRun(t *testing.T) {
	srv := testServer(t)
	cfg := benchConfig{Rate: 200, Duration: 3 * time.Second, TputRate: 2000}
	lat, err := runLatency(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, lat, 3)
	for _, l := range lat {
		assert.Equal(t, 600, l.Pushed, l.Transport)
		assert.Equal(t, l.Pushed, l.Received, l.Transport)
		assert.Zero(t, l.Duplicates, l.Transport)
		assert.Positive(t, l.P50, l.Transport)
		assert.GreaterOrEqual(t, l.P99, l.P50, l.Transport)
		// The servers and this run keep the machine busy; it cannot be
		// more than all of it.
		assert.Positive(t, l.MachineBusy, l.Transport)
		assert.LessOrEqual(t, l.MachineBusy, 100.0, l.Transport)
		// Others' share is a part of it (this test's own server is this
		// process's: not others').
		assert.GreaterOrEqual(t, l.OthersBusy, 0.0, l.Transport)
		assert.Less(t, l.OthersBusy, l.MachineBusy, l.Transport)
	}
	cfg.Duration = time.Second
	tp, err := runThroughput(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, tp, 3)
	assert.Positive(t, tp[0].PushedPerSec)
	assert.Zero(t, tp[1].Backlog, "the consumer drained everything")
	assert.Positive(t, tp[2].DeliveredPerS)

	cfg.MatrixFor = time.Second
	m, err := runMatrix(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, m, 12, "batch 1/10/100 × 1/100 partitions × 1/5 groups")
	for _, r := range m {
		assert.Positive(t, r.PushedPerSec, "%+v", r)
		assert.Positive(t, r.DeliveredPerS, "%+v", r)
	}
}

// The HTML report is one self-contained page with the figures and charts.
func TestHTMLReport(t *testing.T) {
	rep := &report{Machine: "2 cores", Started: time.Now(), Settings: benchConfig{Rate: 100, Duration: time.Second, Wake: "notify"},
		Latency:    []latencyResult{{Setup: "1 instance", Wake: "notify", Transport: "ws", P50: 1.5, P99: 3.25, Received: 10, Pushed: 10}},
		Cluster:    []latencyResult{{Setup: "3 instances, syncnet + NOTIFY", Wake: "notify", Transport: "sse (on instance 3)", P50: 2, P99: 4}},
		Throughput: []throughputResult{{Phase: "push", Batch: 10, Partitions: 1, PushedPerSec: 12345}},
		Idle:       &idleResult{WS: 5, SSE: 5}}
	page := string(rep.html())
	for _, want := range []string{"<svg", "1 instance · notify · ws", "3.25", "sse (on instance 3)", "12345", "2 cores"} {
		assert.Contains(t, page, want)
	}
	assert.NotContains(t, page, "http://", "nothing fetched to view it")
	assert.NotContains(t, page, "https://", "nothing fetched to view it")
}

// The connection scenarios against a real server: holders open what they
// are asked to, and the server counts them.
func TestIdleAndConnections(t *testing.T) {
	srv := testServer(t)
	cfg := benchConfig{IdleWS: 40, IdleSSE: 40, IdleLP: 20, IdleFor: time.Second, Holders: 2, Connections: 80}
	idle, err := runIdle(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 40, idle.WS)
	assert.Equal(t, 20, idle.LongPoll)
	assert.Positive(t, idle.ConnectPerSec)
	ramp, err := runConnections(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, ramp, 4)
	assert.Equal(t, 80, ramp[3].Connections)
	for _, r := range ramp {
		assert.Positive(t, r.ConnectPerSec)
	}
}

// The many-partition drain against a real server: both transports drain
// every partition.
func TestDrainRun(t *testing.T) {
	srv := testServer(t)
	cfg := benchConfig{Duration: 20 * time.Second, DrainPartitions: []int{37}}
	res, err := runDrain(context.Background(), srv, cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, r := range res {
		assert.Equal(t, 37, r.Drained, r.Transport)
		assert.Positive(t, r.PerSec, r.Transport)
	}
	var b strings.Builder
	(&report{Drain: res}).print(&b)
	assert.Contains(t, b.String(), "many-partition drain")
}

// The CPU per message counts the private PostgreSQL's processes: the
// postmaster found through its pid file, its reaped backends and its live
// ones. Here the test cluster stands in for a private one.
func TestPgCPUReadsThePostmasterTree(t *testing.T) {
	conn, err := pgx.Connect(context.Background(), pgtest.AdminURL(t))
	require.NoError(t, err)
	var data string
	require.NoError(t, conn.QueryRow(context.Background(), "SHOW data_directory").Scan(&data))
	require.NoError(t, conn.Close(context.Background()))
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "postgres"), 0o755))
	require.NoError(t, os.Symlink(data, filepath.Join(dir, "postgres", "pgdata")))
	s := &server{pgDir: dir}
	d0, ok := s.pgCPU()
	require.True(t, ok)
	assert.Positive(t, d0, "a running cluster has spent some CPU")
	// Its postmaster is not in this process's tree: the benchmark's own
	// CPU (others' share) names it as a root.
	assert.Contains(t, s.ownRoots(), s.postmaster())
	assert.NotZero(t, s.postmaster())
	_, ok = (&server{}).pgCPU()
	assert.False(t, ok, "no private PostgreSQL, no figure")
}

// A process tree's CPU counts a child while it runs and after it was
// reaped (its parent's cutime), and nothing outside the tree.
func TestTreeCPU_CountsAChildWhileItRunsAndAfterItEnded(t *testing.T) {
	self := os.Getpid()
	before := treeCPU(self)
	child := exec.Command("sh", "-c", "while :; do :; done")
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	own := func() time.Duration {
		f := fanoutload.ProcStat(child.Process.Pid)
		require.GreaterOrEqual(t, len(f), 15)
		return ticks(f[11]) + ticks(f[12])
	}
	require.Eventually(t, func() bool { return own() >= 200*time.Millisecond }, time.Minute, 10*time.Millisecond,
		"the child spins")

	lo := own()
	alone := treeCPU(child.Process.Pid)
	hi := own()
	assert.GreaterOrEqual(t, alone, lo, "a root counts itself")
	assert.LessOrEqual(t, alone, hi, "nothing outside the child's tree")
	assert.GreaterOrEqual(t, treeCPU(self)-before, lo, "a live child is in its parent's tree")

	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	assert.GreaterOrEqual(t, treeCPU(self)-before, hi, "a reaped child is in its parent's cutime")
}

// A tree rooted at process 1 (herald-bench as a container's first
// process, the servers it starts its children) counts its descendants:
// this process among them.
func TestTreeCPU_CountsATreeRootedAtProcessOne(t *testing.T) {
	self := treeCPU(os.Getpid())
	require.Positive(t, self, "this process has spent some CPU")
	assert.GreaterOrEqual(t, treeCPU(1), self)
}

// The mesh follows --wake, but a logical wake takes a replication slot
// and a WAL sender per instance, and the private PostgreSQL has 10 of
// each: a larger mesh is refused before anything starts (the instances
// past the tenth would retry their slot every few seconds, their CPU in
// the figures).
func TestMesh_RefusesMoreLogicalInstancesThanThePrivatePostgreSQLHasSlots(t *testing.T) {
	_, err := runMesh(context.Background(), benchConfig{MeshInstances: 11, Wake: "logical"}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "replication slot")
}

// The push cost with idle groups against a real server: every one of the
// n groups reads the queue once before the pushes are measured, and
// without --dsn only the HTTP pushes are.
func TestPushCost_EveryGroupReadsOnceThenThePushesAreMeasured(t *testing.T) {
	srv := testServer(t)
	const n = 45
	res, err := pushCost(context.Background(), srv.url, nil, n)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, groupsPushCost{IdleGroups: n, Via: "http", Pushes: groupsPushes, P50: res[0].P50, P99: res[0].P99}, res[0])
	assert.Positive(t, res[0].P50)

	r, err := http.Get(srv.url + "/api/v1/consumer-groups")
	require.NoError(t, err)
	defer func() { _ = r.Body.Close() }()
	require.Equal(t, http.StatusOK, r.StatusCode)
	var groups []struct {
		Name string `json:"name"`
	}
	require.NoError(t, json.NewDecoder(r.Body).Decode(&groups))
	names := map[string]bool{}
	for _, g := range groups {
		names[g.Name] = true
	}
	assert.Len(t, names, n, "one group per read: tab00000 … tab00044")
	assert.True(t, names["tab00000"] && names["tab00044"], "%v", names)
}
