//go:build reliability

package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgcluster"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
)

// startEtcd runs a single-node etcd on loopback and returns its client URL.
func startEtcd(t *testing.T, dir string) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	require.NoError(t, err, "etcd is missing: apt-get install -y etcd-server")
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t, "tcp"))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t, "tcp"))
	startProcess(t, dir, "etcd", bin, "--name", "e1", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "e1="+peer)
	require.Eventually(t, func() bool {
		res, err := http.Get(client + "/health")
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "etcd answers; its log:\n%s", tail(dir, "etcd"))
	return client
}

// patroniNode is one Patroni-managed PostgreSQL.
type patroniNode struct {
	name     string
	dir      string // its data directory is dir/data
	pgPort   int
	restPort int
	proc     *process
}

// patroniYAML is a node's configuration: synchronous replication, a short
// TTL (a dead leader's key expires in 20 s, Patroni's minimum), trust on
// loopback.
const patroniYAML = `scope: %[1]s
name: %[2]s
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  hosts: %[4]s
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 100
        fsync: "off"
        wal_keep_size: 128MB
  initdb:
  - encoding: UTF8
  - auth: trust
  pg_hba:
  - local all all trust
  - host replication replicator 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[5]d
  connect_address: 127.0.0.1:%[5]d
  data_dir: %[6]s/data
  bin_dir: %[7]s
  pgpass: %[6]s/pgpass
  authentication:
    replication:
      username: replicator
      password: rep
    superuser:
      username: postgres
      password: pg
  parameters:
    unix_socket_directories: %[6]s
`

// startPatroni starts n nodes of one cluster against etcd.
func startPatroni(t *testing.T, etcd string, n int) []*patroniNode {
	t.Helper()
	bin, err := exec.LookPath("patroni")
	require.NoError(t, err, "patroni is missing: apt-get install -y patroni")
	pgBin := "/usr/lib/postgresql/15/bin"
	if _, err := os.Stat(filepath.Join(pgBin, "postgres")); err != nil {
		pgBin, err = pgcluster.BinDir()
		require.NoError(t, err)
	}
	scope := fmt.Sprintf("herald%d", time.Now().UnixNano()%1e6)
	var nodes []*patroniNode
	for i := range n {
		nd := &patroniNode{name: fmt.Sprintf("pg%d", i+1), dir: postgresDir(t), pgPort: freePort(t, "tcp"), restPort: freePort(t, "tcp")}
		cfg := fmt.Sprintf(patroniYAML, scope, nd.name, nd.restPort, strings.TrimPrefix(etcd, "http://"), nd.pgPort, nd.dir, pgBin)
		require.NoError(t, os.WriteFile(filepath.Join(nd.dir, "patroni.yml"), []byte(cfg), 0o644)) // #nosec G306 -- test config
		nd.proc = startProcess(t, nd.dir, "patroni", bin, filepath.Join(nd.dir, "patroni.yml"))
		// Registered after startProcess's kill, so it runs first: Patroni
		// stops its PostgreSQL on SIGTERM; a postmaster left behind (its
		// Patroni killed) is killed by its pid.
		t.Cleanup(func() {
			nd.proc.stop(syscall.SIGTERM)
			if pid := nd.postmasterPID(); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		nodes = append(nodes, nd)
	}
	return nodes
}

// postmasterPID is the first line of postmaster.pid, or 0.
func (nd *patroniNode) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(nd.dir, "data", "postmaster.pid")) // #nosec G304 -- the test's own file
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// clusterState is GET /cluster of Patroni's REST API.
type clusterState struct {
	Members []struct {
		Name  string `json:"name"`
		Role  string `json:"role"`
		State string `json:"state"`
		Port  int    `json:"port"`
	} `json:"members"`
}

func (nd *patroniNode) cluster() (clusterState, error) {
	var cs clusterState
	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/cluster", nd.restPort))
	if err != nil {
		return cs, err
	}
	defer func() { _ = res.Body.Close() }()
	return cs, json.NewDecoder(res.Body).Decode(&cs)
}

// waitRoles waits until the cluster, asked through ask, has a running
// leader and, when withSync, a streaming synchronous standby; it returns
// the leader's name.
func waitRoles(t *testing.T, ask *patroniNode, withSync bool, ceiling time.Duration) string {
	t.Helper()
	var leader string
	var last clusterState
	ok := assert.Eventually(t, func() bool {
		cs, err := ask.cluster()
		if err != nil {
			return false
		}
		last = cs
		leader = ""
		sync := false
		for _, m := range cs.Members {
			switch {
			case m.Role == "leader" && m.State == "running":
				leader = m.Name
			case m.Role == "sync_standby" && (m.State == "streaming" || m.State == "running"):
				sync = true
			}
		}
		return leader != "" && (sync || !withSync)
	}, ceiling, 200*time.Millisecond, "patroni roles")
	if !ok {
		t.Fatalf("cluster not ready: %+v; patroni log:\n%s", last, tail(ask.dir, "patroni"))
	}
	return leader
}

// A Patroni cluster of two PostgreSQL 15 nodes with synchronous
// replication loses its leader host (Patroni and its postmaster killed
// with SIGKILL); Patroni promotes the standby once the leader key expires,
// and Herald, on the multi-host URL with target_session_attrs=read-write,
// follows it without a restart: pushes and deliveries come back, nothing
// acknowledged is lost, nothing is acked twice, and every partition is
// acked in push order. The times from the kill are logged (docs/failover.md
// quotes them); a partition that comes back late is logged as a stall.
func TestPatroni_LeaderLossLosesNothingWithSyncReplication(t *testing.T) {
	patroniFailover(t, "leader killed", func(t *testing.T, leader, _ *patroniNode) time.Time {
		// The leader's host dies: Patroni first, so that nothing restarts
		// the postmaster, then the postmaster.
		pm := leader.postmasterPID()
		require.Positive(t, pm, "the leader's postmaster.pid")
		kill := time.Now()
		_ = syscall.Kill(-leader.proc.cmd.Process.Pid, syscall.SIGKILL)
		require.NoError(t, syscall.Kill(pm, syscall.SIGKILL))
		return kill
	})
}

// A planned switchover (POST /switchover, what `patronictl switchover`
// sends) moves the leader to the standby under the same flow, with the
// same guarantees.
func TestPatroni_SwitchoverLosesNothing(t *testing.T) {
	patroniFailover(t, "switchover", func(t *testing.T, leader, standby *patroniNode) time.Time {
		at := time.Now()
		res, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/switchover", leader.restPort), "application/json",
			strings.NewReader(fmt.Sprintf(`{"leader":%q,"candidate":%q}`, leader.name, standby.name)))
		require.NoError(t, err)
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, "switchover: %s", b)
		return at
	})
}

// patroniFailover runs the flow on a fresh two-node cluster, calls fail
// (which returns when the fault began), and checks and logs what followed.
func patroniFailover(t *testing.T, what string, fail func(t *testing.T, leader, standby *patroniNode) time.Time) {
	dir := postgresDir(t)
	etcd := startEtcd(t, dir)
	nodes := startPatroni(t, etcd, 2)
	leaderName := waitRoles(t, nodes[0], true, 3*time.Minute)
	var leader, standby *patroniNode
	for _, nd := range nodes {
		if nd.name == leaderName {
			leader = nd
		} else {
			standby = nd
		}
	}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write&connect_timeout=2&sslmode=disable",
		nodes[0].pgPort, nodes[1].pgPort)
	operator := func(c *server.Config) {
		c.SweepMin, c.SweepMax = 0, 0 // the defaults, as an operator runs Herald
		c.Adjust.Listener = nil
	}
	producerSide := servertest.Start(t, dsn, "notify", operator)
	consumerSide := servertest.Start(t, dsn, "notify", operator)
	const parts = 8
	f := newFlow("ha", parts, "ws")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { f.wsConsume(ctx, func() string { return consumerSide.URL() }, "ws") })
	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	wg.Go(func() { f.produce(pctx, func() string { return producerSide.URL() }, 1, 0, 5*time.Millisecond, false) })

	acked := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.acks["ws"])
	}
	require.Eventually(t, func() bool { return acked() >= 300 }, 60*time.Second, 50*time.Millisecond, "the flow runs before the kill")

	kill := fail(t, leader, standby)

	// Back: the first push begun after the first failure since the kill
	// (after the kill when none failed) that succeeded, and the first ack
	// of a message pushed after that.
	var pushesBack, deliveriesBack time.Duration
	ok := assert.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		down := kill
		for _, at := range f.failAt {
			if at.After(kill) {
				down = at
				break
			}
		}
		pushesBack, deliveriesBack = 0, 0
		for n, p := range f.pushed {
			if p.start.After(down) {
				if d := p.answer.Sub(kill); pushesBack == 0 || d < pushesBack {
					pushesBack = d
				}
				if at, ok := f.firstAck["ws"][n]; ok {
					if d := at.Sub(kill); deliveriesBack == 0 || d < deliveriesBack {
						deliveriesBack = d
					}
				}
			}
		}
		return pushesBack > 0 && deliveriesBack > 0
	}, 120*time.Second, 100*time.Millisecond, "pushes and deliveries come back after the %s", what)
	newLeader := waitRoles(t, standby, false, 30*time.Second)
	assert.Equal(t, standby.name, newLeader, "the standby was promoted")
	if !ok {
		t.Logf("patroni (standby) log:\n%s", tail(standby.dir, "patroni"))
	}

	// Five more seconds of flow, then everything pushed must be acked.
	require.Eventually(t, func() bool { return time.Since(kill) > pushesBack+5*time.Second }, time.Minute, 100*time.Millisecond)
	stopProducing()
	left := f.waitDrained(60 * time.Second)
	cancel()
	wg.Wait()

	// Per partition: when it was first acked again after the kill.
	f.mu.Lock()
	back := map[string]time.Duration{}
	for n, at := range f.firstAck["ws"] {
		p := f.pushed[n]
		if p.start.After(kill) {
			if d, ok := back[p.partition]; !ok || at.Sub(kill) < d {
				back[p.partition] = at.Sub(kill)
			}
		}
	}
	pushed, fails, why := len(f.pushed), f.pushFails, fmt.Sprint(f.failWhy)
	f.mu.Unlock()
	var stalls []string
	for i := range parts {
		p := fmt.Sprintf("p%d", i)
		d, ok := back[p]
		if !ok || d > deliveriesBack+5*time.Second {
			stalls = append(stalls, fmt.Sprintf("%s back after %v (ok=%v)", p, d.Round(10*time.Millisecond), ok))
		}
	}

	// What was pushed (201) and never acked: still in the database
	// (stalled) or gone (lost).
	var lost, stalled []int
	if len(left["ws"]) > 0 {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		conn, err := pgx.Connect(cctx, dsn)
		require.NoError(t, err)
		defer func() { _ = conn.Close(cctx) }()
		for _, n := range left["ws"] {
			var found bool
			require.NoError(t, conn.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM herald.messages WHERE transaction_id = $1)`,
				fmt.Sprintf("m-%d", n)).Scan(&found))
			if found {
				stalled = append(stalled, n)
			} else {
				lost = append(lost, n)
			}
		}
	}
	dups, disorder := f.verdict("ws")
	t.Logf("patroni %s (sync): pushed %d (%d push attempts failed: %s); kill → pushes back %v, kill → deliveries back %v; "+
		"lost %d, duplicates %d, unacked but stored %d, late partitions %v",
		what, pushed, fails, why, pushesBack.Round(10*time.Millisecond), deliveriesBack.Round(10*time.Millisecond),
		len(lost), len(dups), len(stalled), stalls)
	assert.Empty(t, lost, "acknowledged pushes lost with synchronous replication")
	assert.Empty(t, dups, "messages acked twice")
	assert.Empty(t, disorder, "acks out of push order within a partition")
	if len(stalled) > 0 || len(stalls) > 0 {
		// Stalls after a connection loss are judged elsewhere (the
		// reconnect tests); here they are recorded, not judged.
		t.Logf("STALL: %d messages stored but not delivered within 60 s of the end; partitions late: %v", len(stalled), stalls)
	}

}
