package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
)

// runWakes measures latency on one instance per wake mode after the first
// (whose server the other scenarios use): each mode gets its own server.
func runWakes(ctx context.Context, cfg benchConfig, wakes []string, log io.Writer) ([]latencyResult, error) {
	var out []latencyResult
	for _, w := range wakes {
		c := cfg
		c.Wake = w
		srv, err := startServer(ctx, c, log)
		if err != nil {
			return nil, err
		}
		rows, err := runLatency(ctx, srv, c, log)
		srv.stop()
		if err != nil {
			return nil, fmt.Errorf("wake %s: %w", w, err)
		}
		out = append(out, rows...)
	}
	return out, nil
}

// runCluster starts three instances on one private PostgreSQL, pushes
// through the first and consumes from the others (WebSocket and long-poll
// on the second, SSE on the third): cross-instance latency, with syncnet
// and without it (NOTIFY alone).
func runCluster(ctx context.Context, cfg benchConfig, log io.Writer) ([]latencyResult, error) {
	var out []latencyResult
	for _, sync := range []bool{true, false} {
		rows, err := clusterRun(ctx, cfg, sync, log)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

func clusterRun(ctx context.Context, cfg benchConfig, sync bool, log io.Writer) ([]latencyResult, error) {
	dir, err := os.MkdirTemp("", "herald-bench-cluster-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	_ = os.Chmod(dir, 0o777) // #nosec G302 -- a throwaway directory the postgres user must enter
	var syncAddrs []string
	for range 3 {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		syncAddrs = append(syncAddrs, c.LocalAddr().String())
		_ = c.Close()
	}
	var key [32]byte
	_, _ = rand.Read(key[:])
	var insts []*server
	defer func() {
		for i := len(insts) - 1; i >= 0; i-- { // the first started the database: it stops it, last
			insts[i].stop()
		}
	}()
	for i := range 3 {
		var extra []string
		if sync {
			var peers []string
			for j, a := range syncAddrs {
				if j != i {
					peers = append(peers, a)
				}
			}
			extra = []string{"--sync-bind", syncAddrs[i], "--sync-peers", strings.Join(peers, ","),
				"--sync-secret", hex.EncodeToString(key[:]), "--server-id", fmt.Sprintf("bench-%d", i+1)}
		}
		s, err := startIn(ctx, cfg, log, dir, "notify", extra...)
		if err != nil {
			return nil, err
		}
		insts = append(insts, s)
	}
	setup := "3 instances, NOTIFY only"
	if sync {
		setup = "3 instances, syncnet + NOTIFY"
	}
	var out []latencyResult
	for _, run := range []struct {
		transport string
		on        int
	}{{"ws", 1}, {"sse", 2}, {"longpoll", 1}} {
		progress(log, "cluster (%s): push through 1, %s consumer on %d", setup, run.transport, run.on+1)
		res, err := latencyRun(ctx, insts[0].url, insts[run.on], cfg, run.transport)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", run.transport, err)
		}
		res.Setup, res.Wake = setup, "notify"
		res.Transport = fmt.Sprintf("%s (on instance %d)", run.transport, run.on+1)
		progress(log, "cluster: %s p50 %.2f ms, p99 %.2f ms (%d/%d received)", res.Transport, res.P50, res.P99,
			res.Received, res.Pushed)
		out = append(out, res)
	}
	return out, nil
}
