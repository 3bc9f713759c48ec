package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/heraldmq/herald/internal/fanoutload"
)

// The restart: P partitions of one queue, one message each, and P
// subscriptions naming one partition each, over WebSockets of 100
// subscriptions (the per-connection limit). Every subscription receives its
// message and leaves it unacked; then the instance is restarted (SIGTERM,
// whose drain gives the leases back, or SIGKILL, after which the new life
// gives them back at start) on the same address, data directory and
// instance id; the clients reconnect as soon as they can and subscribe
// again. Measured: the time from the instance serving again to each
// subscription's first message (p50, p99, max), and herald's and
// PostgreSQL's CPU meanwhile.
const restartSubsPerSocket = 100 // gateway.WSMaxSubscriptions

// restartResult is one restart.
type restartResult struct {
	Partitions  int     `json:"partitions"`
	Sockets     int     `json:"sockets"`
	Signal      string  `json:"signal"`      // SIGTERM or SIGKILL
	DownSeconds float64 `json:"down_s"`      // signal → serving again
	Redelivered int     `json:"redelivered"` // subscriptions that got their message again
	P50         float64 `json:"p50_s"`       // serving again → first message
	P99         float64 `json:"p99_s"`       //
	Max         float64 `json:"max_s"`       //
	CPUSeconds  float64 `json:"cpu_s"`       // herald, serving again → last first message
	PGCPU       float64 `json:"pg_cpu_s"`    // its PostgreSQL, same span
	Load        string  `json:"load"`        // /proc/loadavg at the end
	Profile     string  `json:"profile,omitempty"`
}

// restartClients are the sockets of the restart scenario and what they saw.
type restartClients struct {
	wsURL string
	queue string

	mu    sync.Mutex
	phase int                     // 0 before the restart, 1 after
	first [2]map[string]time.Time // partition → first delivery, per phase
	all   [2]chan struct{}        // closed when every partition was seen in that phase
	parts int
}

func runRestart(ctx context.Context, cfg benchConfig, log io.Writer) (*restartResult, error) {
	p := cfg.RestartPartitions
	dir, err := os.MkdirTemp("", "herald-bench-restart-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	_ = os.Chmod(dir, 0o777) // #nosec G302 -- a throwaway directory the postgres user must enter
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"--instance-id", "bench-restart"}
	a, err := startAt(ctx, cfg, log, dir, addr, cfg.Wake, args...)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			a.stop()
		}
	}()
	q := fmt.Sprintf("bench-restart-%d", time.Now().UnixNano())
	if err := fillPartitions(ctx, a.url, q, p); err != nil {
		return nil, err
	}
	c := &restartClients{wsURL: "ws" + strings.TrimPrefix(a.url, "http") + "/api/v1/ws", queue: q, parts: p}
	for i := range c.first {
		c.first[i] = map[string]time.Time{}
		c.all[i] = make(chan struct{})
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	sockets := (p + restartSubsPerSocket - 1) / restartSubsPerSocket
	for s := range sockets {
		var parts []string
		for i := s * restartSubsPerSocket; i < min(p, (s+1)*restartSubsPerSocket); i++ {
			parts = append(parts, fmt.Sprintf("u%07d", i))
		}
		wg.Go(func() { c.socket(cctx, parts) })
	}
	defer wg.Wait()
	defer cancel()
	progress(log, "restart: %d partitions filled, %d subscriptions on %d sockets", p, p, sockets)
	if err := waitClosed(ctx, c.all[0], 2*time.Minute); err != nil {
		return nil, fmt.Errorf("first deliveries: %d of %d in 2 minutes", c.seen(0), p)
	}

	sig := "SIGTERM"
	if cfg.RestartKill {
		sig = "SIGKILL"
	}
	progress(log, "restart: every subscription holds its message; restarting herald (%s)", sig)
	c.mu.Lock()
	c.phase = 1
	c.mu.Unlock()
	t0 := time.Now()
	if cfg.RestartKill {
		_ = a.cmd.Process.Kill()
		progress(log, "restart: the killed instance exited: %v", <-a.done)
	} else {
		a.dir = "" // the directory outlives this life
		a.stop()
	}
	stopped = true
	if cfg.RestartProfile != "" {
		pprofAddr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		args = append(args, "--pprof-addr", pprofAddr)
	}
	b, err := startAt(ctx, cfg, log, dir, addr, cfg.Wake, args...)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	serving := time.Now()
	cpu0 := b.cpu()
	pg0, _ := b.pgCPU()
	var prof chan error
	if cfg.RestartProfile != "" {
		prof = make(chan error, 1)
		go func() { prof <- fetchProfile(ctx, args[len(args)-1], 10*time.Second, cfg.RestartProfile) }()
	}
	err = waitClosed(ctx, c.all[1], 2*time.Minute)
	end := time.Now()
	r := &restartResult{Partitions: p, Sockets: sockets, Signal: sig, DownSeconds: serving.Sub(t0).Seconds(),
		CPUSeconds: (b.cpu() - cpu0).Seconds(), Load: fanoutload.LoadAverage(), Profile: cfg.RestartProfile}
	if pg, ok := b.pgCPU(); ok {
		r.PGCPU = (pg - pg0).Seconds()
	}
	c.mu.Lock()
	var took []float64
	for _, at := range c.first[1] {
		took = append(took, max(0, at.Sub(serving).Seconds()))
	}
	c.mu.Unlock()
	slices.Sort(took)
	r.Redelivered = len(took)
	if len(took) > 0 {
		r.P50, r.P99, r.Max = took[len(took)/2], took[min(len(took)-1, len(took)*99/100)], took[len(took)-1]
	}
	progress(log, "restart: down %.1fs; %d of %d redelivered, first message after serving again p50 %.2fs p99 %.2fs max %.2fs (%.1fs to all); herald CPU %.1fs, PostgreSQL %.1fs; load %s",
		r.DownSeconds, r.Redelivered, p, r.P50, r.P99, r.Max, end.Sub(serving).Seconds(), r.CPUSeconds, r.PGCPU, r.Load)
	if err != nil {
		return r, fmt.Errorf("redelivery after the restart: %d of %d in 2 minutes", r.Redelivered, p)
	}
	if prof != nil {
		if err := <-prof; err != nil {
			return r, fmt.Errorf("profiling: %w", err)
		}
		progress(log, "restart: CPU profile of the restarted instance in %s (go tool pprof -top herald %s)", cfg.RestartProfile, cfg.RestartProfile)
	}
	return r, nil
}

// socket holds one WebSocket with the subscriptions of parts, opening it
// again (and subscribing again) whenever it closes, until ctx ends.
func (c *restartClients) socket(ctx context.Context, parts []string) {
	d := websocket.Dialer{Subprotocols: []string{"herald.v1"}, HandshakeTimeout: 10 * time.Second}
	for ctx.Err() == nil {
		ws, res, err := d.DialContext(ctx, c.wsURL, nil)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		_ = res.Body.Close()
		stop := context.AfterFunc(ctx, func() { _ = ws.Close() })
		ok := true
		for i, part := range parts {
			f := fmt.Sprintf(`{"type":"subscribe","id":%d,"queue":%q,"partition":%q,"batch":1,"maxInFlight":1}`, i, c.queue, part)
			if ws.WriteMessage(websocket.TextMessage, []byte(f)) != nil {
				ok = false
				break
			}
		}
		for ok {
			_, frame, err := ws.ReadMessage()
			if err != nil {
				break
			}
			c.frame(frame)
		}
		stop()
		_ = ws.Close()
	}
}

// frame notes the partitions of a deliver frame.
func (c *restartClients) frame(frame []byte) {
	if !strings.Contains(string(frame), `"deliver"`) {
		return
	}
	var f struct {
		Messages []struct {
			Partition string `json:"partition"`
		} `json:"messages"`
	}
	if json.Unmarshal(frame, &f) != nil {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.first[c.phase]
	before := len(seen)
	for _, m := range f.Messages {
		if _, ok := seen[m.Partition]; !ok {
			seen[m.Partition] = now
		}
	}
	if before < c.parts && len(seen) >= c.parts {
		close(c.all[c.phase])
	}
}

func (c *restartClients) seen(phase int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.first[phase])
}

func waitClosed(ctx context.Context, ch <-chan struct{}, d time.Duration) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return errors.New("timed out")
	}
}
