package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
)

// meshResult is the idle cost of a mesh of instances found through the
// members table (no --sync-peers).
type meshResult struct {
	Instances      int     `json:"instances"`
	MeasuredFor    float64 `json:"measured_s"`
	CPUPercent     float64 `json:"cpu_percent_of_one_core_all"` // every herald process together
	PGCPUPercent   float64 `json:"pg_cpu_percent_of_one_core"`  // the PostgreSQL they share (members beats, pings)
	DatagramsPerS  float64 `json:"datagrams_per_s_all"`         // sent, every instance together
	KnownAfterSecs float64 `json:"all_known_after_s"`           // last instance started → every instance lists every other
	// With Queues consumed queues on every instance (0: not measured).
	Queues                 int     `json:"queues_per_instance,omitempty"`
	QueuesCPUPercent       float64 `json:"queues_cpu_percent_of_one_core_all,omitempty"`
	QueuesPGCPUPercent     float64 `json:"queues_pg_cpu_percent_of_one_core,omitempty"`
	QueuesDatagramsPerS    float64 `json:"queues_datagrams_per_s_all,omitempty"`
	QueuesDatagramsPerInst float64 `json:"queues_datagrams_per_s_per_instance,omitempty"`
}

// runMesh starts n instances (a pool of 2 each, --wake as the bench's
// own: notify by default, as deployed, each with its LISTEN connection)
// on one private PostgreSQL, syncnet on with no list, waits until each counts every other alive,
// then measures their CPU (from /proc) and datagrams sent over the idle
// window; then, with cfg.MeshQueues queues consumed on every instance,
// once more.
//
// The first instance keeps the private PostgreSQL (--data-dir); the bench
// raises its max_connections (n instances × 2 pooled connections and one outside the pool at times, with room) and
// has it start again, and the others use --database-url, as instances of
// a real deployment do: a shared data directory would have every one of
// them watch the postmaster (a /proc read every 100 ms each).
// meshLogicalMax is the most instances of a mesh with --wake logical: the
// private PostgreSQL's max_replication_slots and max_wal_senders
// (internal/pgcluster), which its command line sets, so that ALTER SYSTEM
// cannot raise them as it raises max_connections.
const meshLogicalMax = 10

func runMesh(ctx context.Context, cfg benchConfig, log io.Writer) (*meshResult, error) {
	n := cfg.MeshInstances
	if n < 2 || n > 500 {
		return nil, fmt.Errorf("--mesh-instances must be between 2 and 500")
	}
	if cfg.Wake == "logical" && n > meshLogicalMax {
		// The instances past the last slot would retry theirs every few
		// seconds, their CPU in the figures.
		return nil, fmt.Errorf("--wake logical takes a replication slot and a WAL sender per instance, and the private PostgreSQL has %d: --mesh-instances at most %d, or another --wake",
			meshLogicalMax, meshLogicalMax)
	}
	if cfg.MeshQueues < 0 || cfg.MeshQueues > 100 {
		return nil, fmt.Errorf("--mesh-queues must be between 0 and 100 (one WebSocket's subscriptions)")
	}
	dir, err := os.MkdirTemp("", "herald-bench-mesh-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	_ = os.Chmod(dir, 0o777) // #nosec G302 -- a throwaway directory the postgres user must enter
	var key [32]byte
	_, _ = rand.Read(key[:])
	var insts []*server
	defer func() {
		for i := len(insts) - 1; i >= 0; i-- {
			insts[i].stop()
		}
	}()
	start := func(i int, db ...string) error {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr := c.LocalAddr().String()
		_ = c.Close()
		args := append([]string{"--db-max-conns", "2", "--sync-bind", addr,
			"--sync-secret", hex.EncodeToString(key[:]), "--server-id", fmt.Sprintf("mesh-%d", i+1),
			// A push buffer each: a shared directory holds 64.
			"--buffer-dir", filepath.Join(dir, fmt.Sprintf("buffer-%d", i+1))}, db...)
		s, err := startIn(ctx, cfg, log, dir, cfg.Wake, args...)
		if err != nil {
			return err
		}
		insts = append(insts, s)
		return nil
	}
	// The keeper: it makes the cluster; max_connections takes a restart.
	if err := start(0); err != nil {
		return nil, err
	}
	url, err := pgURL(dir)
	if err != nil {
		return nil, err
	}
	if err := raiseMaxConnections(ctx, url, 4*n+50); err != nil {
		return nil, err
	}
	insts[0].stop()
	insts = insts[:0]
	if err := start(0); err != nil {
		return nil, err
	}
	if url, err = pgURL(dir); err != nil {
		return nil, err
	}
	for i := 1; i < n; i++ {
		if err := start(i, "--database-url", url); err != nil {
			return nil, err
		}
	}
	started := time.Now()
	progress(log, "mesh: %d instances started; waiting until each counts the others alive", n)
	for {
		all := true
		for _, s := range insts {
			if v, err := s.metric("herald_syncnet_peers_alive"); err != nil || int(v) < n-1 {
				all = false
				break
			}
		}
		if all {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if time.Since(started) > 5*time.Minute {
			return nil, fmt.Errorf("mesh: not every instance sees the others after 5 minutes")
		}
	}
	res := &meshResult{Instances: n, KnownAfterSecs: time.Since(started).Seconds()}
	// Let the start's work settle (first sweeps, the first chores).
	if err := sleepCtx(ctx, 10*time.Second); err != nil {
		return nil, err
	}
	cpu, pg, dgrams, el, err := meshWindow(ctx, insts, cfg.IdleFor, log)
	if err != nil {
		return nil, err
	}
	res.MeasuredFor, res.CPUPercent, res.PGCPUPercent, res.DatagramsPerS = el, cpu, pg, dgrams
	progress(log, "mesh: %d instances idle: %.1f%% of a core in all (PostgreSQL %.1f%%), %.1f datagrams/s in all",
		n, cpu, pg, dgrams)
	if cfg.MeshQueues == 0 {
		return res, nil
	}
	var conns []*websocket.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for _, s := range insts {
		c, err := consumeQueues(ctx, s, cfg.MeshQueues)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	progress(log, "mesh: %d queues consumed on each instance; waiting until presence settles", cfg.MeshQueues)
	// Presence travels by digest on the members beat (2 s); a few beats.
	if err := sleepCtx(ctx, 15*time.Second); err != nil {
		return nil, err
	}
	cpu, pg, dgrams, _, err = meshWindow(ctx, insts, cfg.IdleFor, log)
	if err != nil {
		return nil, err
	}
	res.Queues, res.QueuesCPUPercent, res.QueuesPGCPUPercent, res.QueuesDatagramsPerS = cfg.MeshQueues, cpu, pg, dgrams
	res.QueuesDatagramsPerInst = dgrams / float64(n)
	progress(log, "mesh: %d instances idle with %d consumed queues each: %.1f%% of a core in all (PostgreSQL %.1f%%), %.2f datagrams/s per instance",
		n, cfg.MeshQueues, cpu, pg, res.QueuesDatagramsPerInst)
	return res, nil
}

// meshWindow measures the instances' CPU (percent of one core, all
// together), the PostgreSQL's, and the datagrams they send, over d.
func meshWindow(ctx context.Context, insts []*server, d time.Duration, log io.Writer) (cpu, pg, dgrams, secs float64, err error) {
	sample := func() (cpu, pg time.Duration, sent float64) {
		for _, s := range insts {
			cpu += s.cpu()
			v, _ := s.metric("herald_syncnet_sent_total")
			sent += v
		}
		pg, _ = insts[0].pgCPU()
		return cpu, pg, sent
	}
	t0 := time.Now()
	cpu0, pg0, sent0 := sample()
	progress(log, "mesh: idle for %v", d)
	if err := sleepCtx(ctx, d); err != nil {
		return 0, 0, 0, 0, err
	}
	cpu1, pg1, sent1 := sample()
	el := time.Since(t0).Seconds()
	// The scrapes themselves send nothing over syncnet; their CPU is in
	// the figure (one /metrics per instance at each end).
	return 100 * (cpu1 - cpu0).Seconds() / el, 100 * (pg1 - pg0).Seconds() / el, (sent1 - sent0) / el, el, nil
}

// consumeQueues opens one WebSocket to s subscribed to mesh-q0 … mesh-q<k-1>.
func consumeQueues(ctx context.Context, s *server, k int) (*websocket.Conn, error) {
	d := websocket.Dialer{Subprotocols: []string{"herald.v1"}, ReadBufferSize: 1024, WriteBufferSize: 1024}
	ws, res, err := d.DialContext(ctx, "ws"+strings.TrimPrefix(s.url, "http")+"/api/v1/ws", nil)
	if err != nil {
		return nil, fmt.Errorf("mesh: dialling %s: %w", s.url, err)
	}
	_ = res.Body.Close()
	for q := range k {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"subscribe","queue":"mesh-q`+strconv.Itoa(q)+`"}`)); err != nil {
			_ = ws.Close()
			return nil, fmt.Errorf("mesh: subscribing: %w", err)
		}
		if _, _, err := ws.ReadMessage(); err != nil { // subscribed
			_ = ws.Close()
			return nil, fmt.Errorf("mesh: subscribing: %w", err)
		}
	}
	go func() {
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}()
	return ws, nil
}

// pgURL is the URL of the private PostgreSQL of dir (its port from
// postmaster.pid).
func pgURL(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "postgres", "pgdata", "postmaster.pid")) //nolint:gosec // G304: the bench's own data directory
	if err != nil {
		return "", fmt.Errorf("mesh: reading postmaster.pid: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return "", fmt.Errorf("mesh: postmaster.pid has no port")
	}
	return "postgres://postgres@127.0.0.1:" + strings.TrimSpace(lines[3]) + "/herald?sslmode=disable", nil
}

// raiseMaxConnections sets max_connections (taken at the next start).
func raiseMaxConnections(ctx context.Context, url string, n int) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("mesh: connecting: %w", err)
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	if _, err := c.Exec(ctx, "ALTER SYSTEM SET max_connections = "+strconv.Itoa(n)); err != nil {
		return fmt.Errorf("mesh: raising max_connections: %w", err)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
