package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/internal/pgcluster"
	"github.com/heraldmq/herald/internal/server"
)

// `herald demo`: the docker-compose topology without Docker. One private
// PostgreSQL, three instances on loopback that gossip over syncnet, and a
// producer pushing a few messages a second to the demo queue. Ctrl-C stops
// it all.

type demoConfig struct {
	dataDir   string
	ports     []int // HTTP
	syncPorts []int // syncnet (UDP)
	queue     string
	rate      float64
	logLevel  string
}

func parseDemo(args []string, out io.Writer) (*demoConfig, error) {
	c := &demoConfig{}
	fs := flag.NewFlagSet("herald demo", flag.ContinueOnError)
	fs.SetOutput(out)
	var ports, syncPorts string
	fs.StringVar(&c.dataDir, "data-dir", "./.herald-demo", "directory of the demo's private PostgreSQL")
	fs.StringVar(&ports, "ports", "6632,6633,6634", "HTTP ports of the three instances (on 127.0.0.1)")
	fs.StringVar(&syncPorts, "sync-ports", "7632,7633,7634", "syncnet UDP ports of the three instances (on 127.0.0.1)")
	fs.StringVar(&c.queue, "queue", "demo", "queue the producer pushes to")
	fs.Float64Var(&c.rate, "rate", 2, "messages per second the producer pushes (0: none)")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level of the instances")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: herald demo [flags]\n\nThree Herald instances with syncnet on one private PostgreSQL, and a demo producer.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if c.ports, err = portList(ports); err != nil {
		return nil, fmt.Errorf("--ports: %w", err)
	}
	if c.syncPorts, err = portList(syncPorts); err != nil {
		return nil, fmt.Errorf("--sync-ports: %w", err)
	}
	if c.rate < 0 {
		return nil, errors.New("--rate must not be negative")
	}
	return c, nil
}

func portList(v string) ([]int, error) {
	parts := splitList(v)
	if len(parts) != 3 {
		return nil, fmt.Errorf("want three ports, got %q", v)
	}
	out := make([]int, 3)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("bad port %q", p)
		}
		out[i] = n
	}
	return out, nil
}

// demo runs the topology until ctx ends.
func demo(ctx context.Context, c *demoConfig, stdout io.Writer, log zerolog.Logger) (err error) {
	dir, err := filepath.Abs(filepath.Join(c.dataDir, "postgres"))
	if err != nil {
		return fmt.Errorf("resolving data dir: %w", err)
	}
	// Ports first, before PostgreSQL: a taken one fails in a moment.
	lns := make([]net.Listener, 3)
	defer func() {
		for _, ln := range lns {
			if ln != nil {
				_ = ln.Close()
			}
		}
	}()
	for i, p := range c.ports {
		if lns[i], err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
			return demoPortError(fmt.Sprintf("127.0.0.1:%d", p), "--ports", err)
		}
	}
	for _, p := range c.syncPorts {
		if err := probeUDP(fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
			return demoPortError(fmt.Sprintf("127.0.0.1:%d (UDP)", p), "--sync-ports", err)
		}
	}
	fmt.Fprintf(stdout, "herald demo: starting PostgreSQL in %s …\n", dir)
	cluster, err := pgcluster.Start(ctx, pgcluster.Config{Dir: dir, Logger: log.With().Str("component", "pgcluster").Logger()})
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, rerr := cluster.Release(rctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("stopping PostgreSQL: %w", rerr))
		}
	}()

	var key [32]byte
	_, _ = rand.Read(key[:])
	secret := hex.EncodeToString(key[:]) // a new one per run: only these three share it
	urls := make([]string, 3)
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	defer wg.Wait()
	// One instance failing stops the others (deferred calls run last first:
	// cancel, then wait).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range 3 {
		cfg, err := parseConfig("serve", nil, func(string) string { return "" }, io.Discard)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("herald-%d", i+1)
		cfg.Addr = fmt.Sprintf("127.0.0.1:%d", c.ports[i])
		cfg.Listener, lns[i] = lns[i], nil // the instance owns it now
		cfg.DatabaseURL = cluster.URL()
		cfg.DataDir = c.dataDir // the push buffer's too: <data-dir>/buffer, a file per instance
		cfg.InstanceID, cfg.ServerID = name, name
		cfg.SyncBind = fmt.Sprintf("127.0.0.1:%d", c.syncPorts[i])
		cfg.SyncSecret = secret
		cfg.DrainWindow = time.Second
		for j := range 3 {
			if j != i {
				cfg.SyncPeers = append(cfg.SyncPeers, fmt.Sprintf("127.0.0.1:%d", c.syncPorts[j]))
			}
		}
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d/", c.ports[i])
		lvl, _ := zerolog.ParseLevel(c.logLevel)
		ilog := log.Level(lvl).With().Str("instance", name).Logger()
		sc := cfg.Config
		sc.Logger, sc.Version = ilog, buildVersion()
		wg.Go(func() {
			srv, err := server.New(ctx, sc)
			if err == nil {
				err = srv.Run(ctx)
			}
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	for _, u := range urls {
		if err := waitHealthy(ctx, u+"health", errs); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "herald demo: three instances with syncnet on one PostgreSQL; open any of\n")
	for _, u := range urls {
		fmt.Fprintf(stdout, "  %s\n", u)
	}
	if c.rate > 0 {
		fmt.Fprintf(stdout, "herald demo: a producer pushes %g messages/s to queue %q through all three\n", c.rate, c.queue)
		wg.Go(func() { produce(ctx, urls, c.queue, c.rate, 4, log) })
	}
	fmt.Fprintf(stdout, "herald demo: Ctrl-C stops everything\n")
	select {
	case <-ctx.Done():
		fmt.Fprintf(stdout, "herald demo: stopping …\n")
		return nil
	case err := <-errs:
		return err
	}
}

// demoPortError says which demo port is taken and how to choose others.
func demoPortError(addr, flag string, err error) error {
	return portError(addr, flag, err, "(another herald demo or herald serve?): stop it, or give the demo "+
		"other ports, e.g. herald demo --ports 6640,6641,6642 --sync-ports 7640,7641,7642 ("+flag+")")
}

// waitHealthy polls url until it answers 200, an instance fails, or ctx ends.
func waitHealthy(ctx context.Context, url string, errs <-chan error) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if healthy(ctx, url) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return err
		case <-t.C:
		}
	}
}

func healthy(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// produce pushes rate messages a second to queue, over partitions p0…pN-1,
// through each of urls in turn, until ctx ends. A failed push (an instance
// restarting) is logged and the next goes to the next instance.
func produce(ctx context.Context, urls []string, queue string, rate float64, partitions int, log zerolog.Logger) {
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	client := &http.Client{Timeout: 5 * time.Second}
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		url := strings.TrimSuffix(urls[n%len(urls)], "/")
		body, _ := json.Marshal(map[string]any{"items": []map[string]any{{
			"queue": queue, "partition": fmt.Sprintf("p%d", n%partitions),
			"payload": map[string]any{"n": n, "from": "demo-producer", "via": url, "at": time.Now().UTC().Format(time.RFC3339Nano)},
		}}})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/v1/push", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn().Err(err).Str("url", url).Msg("demo producer: push failed")
			}
			continue
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			log.Warn().Int("status", res.StatusCode).Str("url", url).Msg("demo producer: push refused")
		}
	}
}

// `herald produce`: the demo producer on its own (docker compose runs it).
func runProduce(ctx context.Context, args []string, stderr io.Writer, log zerolog.Logger) error {
	fs := flag.NewFlagSet("herald produce", flag.ContinueOnError)
	fs.SetOutput(stderr)
	urls := fs.String("url", "http://127.0.0.1:6632", "comma-separated base URLs of the instances, pushed to in turn")
	queue := fs.String("queue", "demo", "queue to push to")
	rate := fs.Float64("rate", 2, "messages per second")
	partitions := fs.Int("partitions", 4, "partitions p0…pN-1 the messages go to in turn")
	if err := fs.Parse(args); err != nil {
		return err
	}
	list := splitList(*urls)
	switch {
	case len(list) == 0:
		return errors.New("--url is required")
	case *rate <= 0 || *partitions < 1:
		return errors.New("--rate and --partitions must be positive")
	}
	log.Info().Strs("urls", list).Str("queue", *queue).Float64("rate", *rate).Msg("demo producer running")
	produce(ctx, list, *queue, *rate, *partitions, log)
	return nil
}

// `herald health`: exit 0 when the instance answers /health with 200 (the
// container image has no curl; its health check runs this).
func runHealth(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("herald health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:6632/health", "health endpoint to check")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !healthy(ctx, *url) {
		return fmt.Errorf("%s is not healthy", *url)
	}
	return nil
}
