package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// connectionsResult is one step of the ramp.
type connectionsResult struct {
	Connections   int     `json:"connections"` // open after this step (half WebSocket, half SSE)
	ConnectPerSec float64 `json:"connect_per_s"`
	RSS           int64   `json:"rss_bytes"`
	BytesPerConn  float64 `json:"bytes_per_conn"` // (RSS − RSS before the ramp) / connections
}

// runConnections ramps to --connections concurrent connections in four
// steps, each opened by its own holder processes on top of the previous
// ones: the connect rate of each step, and the RSS per connection as it
// grows.
func runConnections(ctx context.Context, srv *server, cfg benchConfig, log io.Writer) ([]connectionsResult, error) {
	if lim := openFileLimit(srv.pid); lim > 0 {
		if capped := serverCap(srv, lim); cfg.Connections > capped {
			progress(log, "connections: the server's open-file limit (%d) caps the ramp at %d", lim, capped)
			cfg.Connections = capped
		}
	}
	time.Sleep(time.Second)
	before := srv.rss()
	var out []connectionsResult
	var releases []func()
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	const steps = 4
	total := 0
	for i := range steps {
		n := cfg.Connections / steps
		if i == steps-1 {
			n = cfg.Connections - total
		}
		progress(log, "connections: %d more (%d → %d)", n, total, total+n)
		start := time.Now()
		release, err := hold(ctx, srv, n/2, n-n/2, 0, cfg.Holders, log)
		releases = append(releases, release)
		if err != nil {
			return nil, err
		}
		rate := float64(n) / time.Since(start).Seconds()
		total += n
		// A client has its answer a moment before the server counts
		// its stream: wait for the count, with a ceiling.
		var open float64
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			ws, _ := srv.metric("herald_ws_connections")
			sse, _ := srv.metric("herald_sse_streams")
			if open = ws + sse; int(open) == total || time.Now().After(deadline) {
				break
			}
		}
		if int(open) != total {
			return nil, fmt.Errorf("server holds %.0f connections, want %d", open, total)
		}
		time.Sleep(2 * time.Second) // let the connects' garbage be collected
		r := connectionsResult{Connections: total, ConnectPerSec: rate, RSS: srv.rss()}
		if total > 0 {
			r.BytesPerConn = float64(r.RSS-before) / float64(total)
		}
		progress(log, "connections: %d open, %.0f connects/s, RSS %.1f MiB, %.1f KB/conn", total, rate,
			float64(r.RSS)/(1<<20), r.BytesPerConn/1024)
		out = append(out, r)
	}
	return out, nil
}
