package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/heraldmq/herald/internal/fanoutload"
)

// followersCmd is the hidden subcommand of a fanout follower child.
const followersCmd = "__follow"

// fanoutPerProcess is how many followers one child holds at most.
const fanoutPerProcess = 5000

// fanoutResult is one fanout measurement.
type fanoutResult struct {
	Setup      string  `json:"setup"`
	Followers  int     `json:"followers"`
	Rate       int     `json:"rate"`
	Pushed     int     `json:"pushed"`
	Expected   int64   `json:"deliveries_expected"`
	Received   int64   `json:"deliveries_in_order"`
	Violations int64   `json:"order_violations"`
	Losses     int64   `json:"losses"`
	Ended      int     `json:"streams_ended"`
	P50        float64 `json:"p50_ms"`
	P90        float64 `json:"p90_ms"`
	P99        float64 `json:"p99_ms"`
	Max        float64 `json:"max_ms"`
	// CPUPer1k: CPU seconds of herald (every instance) and its PostgreSQL
	// per 1,000 deliveries, from the first push to the last receipt.
	CPUPer1k       float64 `json:"cpu_s_per_1000_deliveries"`
	HeraldCPUPer1k float64 `json:"herald_cpu_s_per_1000_deliveries"`
	// RSSPerFollower and HeapPerFollower: the growth of herald's RSS and
	// Go heap in use (all instances) with the followers connected and idle,
	// per follower.
	// ClientCPUPer1k: the follower processes' CPU per 1,000 deliveries
	// (the load generator, on the same cores).
	ClientCPUPer1k  float64 `json:"followers_cpu_s_per_1000_deliveries"`
	RSSPerFollower  float64 `json:"idle_rss_bytes_per_follower"`
	HeapPerFollower float64 `json:"idle_heap_bytes_per_follower"`
	Load            string  `json:"load"` // 1/5/15 min load before and after
	Profile         string  `json:"cpu_profile,omitempty"`
}

// runFanout measures each case of --fanout on a fresh server (its memory
// baseline is an empty one), then each of --fanout-cluster on three.
func runFanout(ctx context.Context, target *server, cfg benchConfig, log io.Writer) ([]fanoutResult, error) {
	var out []fanoutResult
	for _, c := range cfg.FanoutCases {
		srv := target
		var pprofAddr string
		if cfg.URL == "" {
			var extra []string
			var err error
			if cfg.FanoutProfile != "" {
				if pprofAddr, err = freeAddr(); err != nil {
					return nil, err
				}
				extra = []string{"--pprof-addr", pprofAddr}
			}
			if srv, err = startServer(ctx, cfg, log, extra...); err != nil {
				return nil, err
			}
		}
		res, err := fanoutRun(ctx, []*server{srv}, c, cfg, pprofAddr, log)
		if srv != target {
			srv.stop()
		}
		if err != nil {
			return nil, fmt.Errorf("%v: %w", c, err)
		}
		res.Setup = "1 instance"
		out = append(out, res)
	}
	for _, c := range cfg.FanoutCluster {
		if cfg.URL != "" {
			return nil, errors.New("--fanout-cluster starts its own instances (no --url)")
		}
		insts, stop, err := startCluster(ctx, cfg, true, log)
		if err != nil {
			stop()
			return nil, err
		}
		res, err := fanoutRun(ctx, insts, c, cfg, "", log)
		stop()
		if err != nil {
			return nil, fmt.Errorf("3 instances, %v: %w", c, err)
		}
		res.Setup = "3 instances, syncnet on; pushes to 1"
		out = append(out, res)
	}
	return out, nil
}

// freeAddr is a free loopback TCP address (for a server to start on).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String(), nil
}

// fanoutRun opens c.Followers SSE follows of one queue spread over insts,
// measures their idle memory, pushes c.Rate messages a second for
// --duration to the first instance, one at a time, and collects what every
// follower received.
func fanoutRun(ctx context.Context, insts []*server, c fanoutload.Case, cfg benchConfig, pprofAddr string,
	log io.Writer) (fanoutResult, error) {
	res := fanoutResult{Followers: c.Followers, Rate: c.Rate, Load: fanoutload.LoadAverage()}
	q := fmt.Sprintf("bench-fanout-%d", time.Now().UnixNano())
	var urls []string
	for _, s := range insts {
		urls = append(urls, s.url)
	}
	sum := func(f func(*server) float64) float64 {
		t := 0.0
		for _, s := range insts {
			t += f(s)
		}
		return t
	}
	heap := func(s *server) float64 { v, _ := s.metric("go_memstats_heap_inuse_bytes"); return v }
	rss := func(s *server) float64 { return float64(s.rss()) }
	time.Sleep(time.Second) // let the servers settle after start-up
	rss0, heap0 := sum(rss), sum(heap)

	exe, err := os.Executable()
	if err != nil {
		return res, err
	}
	procs := (c.Followers + fanoutPerProcess - 1) / fanoutPerProcess
	total := int(float64(c.Rate) * cfg.Duration.Seconds())
	warm := min(2*c.Rate, total/5) // the first two seconds warm connections, caches and plans
	progress(log, "fanout: %d SSE followers of %s on %d instance(s) from %d processes", c.Followers, q, len(insts), procs)
	t0 := time.Now()
	fp, err := fanoutload.StartFollowers(ctx, []string{exe, followersCmd}, procs, c.Followers, urls,
		"/api/v1/follow/queue/"+q, ": connected", warm, log)
	if err != nil {
		return res, err
	}
	defer fp.Close()
	// Every follow has joined its hub (none is still catching up).
	for deadline := time.Now().Add(60 * time.Second); ; {
		if n := sum(func(s *server) float64 { v, _ := s.metric("herald_followers"); return v }); int(n) == c.Followers {
			break
		} else if time.Now().After(deadline) {
			return res, fmt.Errorf("the servers report %.0f followers, want %d", n, c.Followers)
		}
		time.Sleep(50 * time.Millisecond)
	}
	progress(log, "fanout: %d followers in %.1f s", c.Followers, time.Since(t0).Seconds())
	time.Sleep(2 * time.Second) // the connects' garbage collected
	res.RSSPerFollower = (sum(rss) - rss0) / float64(c.Followers)
	res.HeapPerFollower = (sum(heap) - heap0) / float64(c.Followers)

	cpu := func() (herald, pg time.Duration) {
		for _, s := range insts {
			herald += s.cpu()
		}
		pg, _ = insts[0].pgCPU() // one PostgreSQL for all
		return herald, pg
	}
	var profile chan error
	if pprofAddr != "" {
		res.Profile = fmt.Sprintf("%s-%v.pprof", cfg.FanoutProfile, c)
		profile = make(chan error, 1)
		go func() { profile <- fetchProfile(ctx, pprofAddr, cfg.Duration, res.Profile) }()
	}
	h0, pg0 := cpu()
	c0 := fp.CPU()
	progress(log, "fanout: pushing %d msgs/s for %v to %s, one push at a time", c.Rate, cfg.Duration, urls[0])
	pushed, err := fanoutload.PaceSequential(ctx, c.Rate, total, func(ctx context.Context, i int) error {
		body := fmt.Sprintf(`{"items":[{"queue":%q,"payload":{"t":%d,"i":%d}}]}`, q, time.Now().UnixNano(), i)
		return post(ctx, urls[0]+"/api/v1/push", body, http.StatusCreated)
	})
	res.Pushed = pushed
	if err != nil {
		return res, err
	}
	counts, err := fp.Finish(total)
	if err != nil {
		return res, err
	}
	h1, pg1 := cpu()
	c1 := fp.CPU()
	if profile != nil {
		if err := <-profile; err != nil {
			progress(log, "fanout: no CPU profile: %v", err)
			res.Profile = ""
		}
	}
	res.Expected, res.Received, res.Violations = counts.Expected, counts.Received, counts.Violations
	res.Losses, res.Ended = counts.Losses, counts.Ended
	res.P50, res.P90, res.P99, res.Max = counts.Quantile(50), counts.Quantile(90), counts.Quantile(99), counts.Quantile(100)
	if counts.Received > 0 {
		res.CPUPer1k = (h1 - h0 + pg1 - pg0).Seconds() * 1000 / float64(counts.Received)
		res.HeraldCPUPer1k = (h1 - h0).Seconds() * 1000 / float64(counts.Received)
		res.ClientCPUPer1k = (c1 - c0).Seconds() * 1000 / float64(counts.Received)
	}
	res.Load += " → " + fanoutload.LoadAverage()
	progress(log, "fanout: %d/%d deliveries in order, %d violations, %d lost; p50 %.1f ms, p99 %.1f ms; %.4f CPU s/1k (herald %.4f; followers %.4f); idle %.0f B RSS, %.0f B heap per follower; load %s",
		res.Received, res.Expected, res.Violations, res.Losses, res.P50, res.P99, res.CPUPer1k, res.HeraldCPUPer1k, res.ClientCPUPer1k,
		res.RSSPerFollower, res.HeapPerFollower, res.Load)
	return res, nil
}

// fetchProfile writes a CPU profile of d from herald's pprof listener.
func fetchProfile(ctx context.Context, addr string, d time.Duration, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, max(int(d.Seconds()), 1)), nil)
	if err != nil {
		return err
	}
	res, err := (&http.Client{Timeout: d + time.Minute}).Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof: %s", res.Status)
	}
	f, err := os.Create(file) // #nosec G304 -- the file the user named
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, res.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// startCluster starts three instances on one private PostgreSQL (with
// syncnet when sync is set); stop stops them, the first last.
func startCluster(ctx context.Context, cfg benchConfig, sync bool, log io.Writer) (insts []*server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "herald-bench-cluster-")
	if err != nil {
		return nil, func() {}, err
	}
	_ = os.Chmod(dir, 0o777) // #nosec G302 -- a throwaway directory the postgres user must enter
	stop = func() {
		for i := len(insts) - 1; i >= 0; i-- { // the first started the database: it stops it, last
			insts[i].stop()
		}
		_ = os.RemoveAll(dir)
	}
	var syncAddrs []string
	for range 3 {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, stop, err
		}
		syncAddrs = append(syncAddrs, c.LocalAddr().String())
		_ = c.Close()
	}
	var key [32]byte
	_, _ = rand.Read(key[:])
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
			return insts, stop, err
		}
		insts = append(insts, s)
	}
	return insts, stop, nil
}
