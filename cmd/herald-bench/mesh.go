package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// meshResult is the idle cost of a mesh of instances found through the
// members table (no --sync-peers).
type meshResult struct {
	Instances      int     `json:"instances"`
	MeasuredFor    float64 `json:"measured_s"`
	CPUPercent     float64 `json:"cpu_percent_of_one_core_all"` // every herald process together
	DatagramsPerS  float64 `json:"datagrams_per_s_all"`         // sent, every instance together
	KnownAfterSecs float64 `json:"all_known_after_s"`           // last instance started → every instance lists every other
}

// runMesh starts n instances (a pool of 2 each) on one private PostgreSQL,
// syncnet on with no list, waits until each counts every other alive,
// then measures their CPU (from /proc) and datagrams sent over the idle
// window.
func runMesh(ctx context.Context, cfg benchConfig, log io.Writer) (*meshResult, error) {
	n := cfg.MeshInstances
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
	for i := range n {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := c.LocalAddr().String()
		_ = c.Close()
		s, err := startIn(ctx, cfg, log, dir, "poll", "--db-max-conns", "2", "--sync-bind", addr,
			"--sync-secret", hex.EncodeToString(key[:]), "--server-id", fmt.Sprintf("mesh-%d", i+1))
		if err != nil {
			return nil, err
		}
		insts = append(insts, s)
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
	sample := func() (cpu time.Duration, sent float64) {
		for _, s := range insts {
			cpu += s.cpu()
			v, _ := s.metric("herald_syncnet_sent_total")
			sent += v
		}
		return cpu, sent
	}
	t0 := time.Now()
	cpu0, sent0 := sample()
	progress(log, "mesh: idle for %v", cfg.IdleFor)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(cfg.IdleFor):
	}
	cpu1, sent1 := sample()
	el := time.Since(t0).Seconds()
	res.MeasuredFor = el
	res.CPUPercent = 100 * (cpu1 - cpu0).Seconds() / el
	// The scrapes themselves send nothing over syncnet; their CPU is in
	// the figure (one /metrics per instance at each end).
	res.DatagramsPerS = (sent1 - sent0) / el
	progress(log, "mesh: %d instances idle: %.1f%% of a core in all, %.1f datagrams/s in all", n, res.CPUPercent, res.DatagramsPerS)
	return res, nil
}
