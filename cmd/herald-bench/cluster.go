package main

import (
	"context"
	"fmt"
	"io"
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
// and without it (NOTIFY alone); then a WebSocket on the first, the
// same-instance control.
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
	insts, stop, err := startCluster(ctx, cfg, sync, log)
	defer stop()
	if err != nil {
		return nil, err
	}
	setup := "3 instances, NOTIFY only"
	if sync {
		setup = "3 instances, syncnet + NOTIFY"
	}
	var out []latencyResult
	for _, run := range []struct {
		transport string
		on        int
	}{{"ws", 1}, {"sse", 2}, {"longpoll", 1}, {"ws", 0}} {
		// The last row is the control: a consumer on the instance pushed
		// to, beside the same two others, so that a tail the machine makes
		// (three instances, PostgreSQL and this load on the same cores) is
		// told from one the hop between instances adds.
		progress(log, "cluster (%s): push through 1, %s consumer on %d", setup, run.transport, run.on+1)
		res, err := latencyRun(ctx, insts[0].url, insts[run.on], cfg, run.transport)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", run.transport, err)
		}
		res.Setup, res.Wake = setup, "notify"
		res.Transport = fmt.Sprintf("%s (on instance %d)", run.transport, run.on+1)
		progress(log, "cluster: %s p50 %.2f ms, p99 %.2f ms (%d/%d received), machine %.0f%% busy (others %.0f%%)", res.Transport,
			res.P50, res.P99, res.Received, res.Pushed, res.MachineBusy, res.OthersBusy)
		out = append(out, res)
	}
	return out, nil
}
