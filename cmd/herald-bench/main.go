package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/internal/fanoutload"
)

type benchConfig struct {
	URL      string
	PID      int
	Herald   string
	Wake     string
	Out      string
	Rate     int
	Duration time.Duration
	// LatencyPartitions: the partitions the latency scenario's pushes
	// spread over (16 by default; 1 measures one busy partition).
	LatencyPartitions int
	// LatencyTransports: the consumers the latency scenario measures, in
	// order (ws, sse, longpoll).
	LatencyTransports []string
	IdleWS            int
	IdleSSE           int
	IdleLP            int
	IdleFor           time.Duration
	// MeshInstances: the mesh scenario's instances.
	MeshInstances int
	// MeshQueues: consumed queues per instance (one WebSocket each with
	// that many subscriptions, at most 100) in the mesh's second window.
	MeshQueues  int
	Holders     int
	TputRate    int
	MatrixFor   time.Duration
	Connections int
	// DrainPartitions: the drain scenario's partition counts.
	DrainPartitions []int
	// The restart scenario: partitions (one subscription each), SIGKILL
	// instead of SIGTERM, and a file for the restarted instance's CPU
	// profile ("" takes none).
	RestartPartitions int
	RestartKill       bool
	RestartProfile    string
	// FanoutCases and FanoutCluster: the fanout scenario's followers and
	// rates, on one instance and on three.
	FanoutCases   []fanoutload.Case
	FanoutCluster []fanoutload.Case
	// FanoutProfile: a file prefix for CPU profiles of herald during the
	// single-instance fanout pushes; empty takes none.
	FanoutProfile string
	// DSN: the server's PostgreSQL, for the WAL the groups scenario's
	// pushes write ("" measures no WAL).
	DSN string
}

// fanoutMax is the most followers one fanout case puts on one instance.
func (c benchConfig) fanoutMax() int {
	n := 0
	for _, f := range c.FanoutCases {
		n = max(n, f.Followers)
	}
	return n
}

func main() {
	// A connection holder is a child process of the idle scenario: one
	// process cannot hold 20,000 sockets under this machine's file limit.
	if len(os.Args) > 1 && os.Args[1] == holderCmd {
		os.Exit(runHolder(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == followersCmd {
		os.Exit(fanoutload.RunFollowers(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// ownInstances are the scenarios that start instances of their own, and
// so cannot measure --url: why, as their refusal says it.
var ownInstances = map[string]string{"cluster": "starts its own instances", "restart": "restarts an instance of its own"}

func run(args []string, stdout, stderr io.Writer) int {
	var cfg benchConfig
	fs := flag.NewFlagSet("herald-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.URL, "url", "", "Herald to measure (http://host:port); empty starts one")
	fs.IntVar(&cfg.PID, "pid", 0, "process id of the --url server, for its memory and CPU")
	fs.StringVar(&cfg.Herald, "herald", "", "herald binary to start; empty looks next to herald-bench, then in PATH")
	fs.StringVar(&cfg.Wake, "wake", "notify", "--wake of the server it starts; a comma list (notify,logical,poll) measures latency once per mode, side by side")
	fs.StringVar(&cfg.Out, "out", "herald-bench.json", "JSON results file (and an HTML report next to it, .html); empty writes none")
	fs.IntVar(&cfg.MeshInstances, "mesh-instances", 100, "mesh: instances started (a pool of 2 each), found through the members table")
	fs.IntVar(&cfg.MeshQueues, "mesh-queues", 100, "mesh: queues consumed on every instance (one WebSocket, at most 100) in a second idle window; 0 skips it")
	fs.IntVar(&cfg.Rate, "rate", 1000, "latency: messages per second pushed")
	fs.IntVar(&cfg.LatencyPartitions, "latency-partitions", latencyPartitions, "latency: partitions the pushes spread over (1 to 1000; 1 measures one busy partition)")
	latTransports := fs.String("latency-transports", "ws,sse,longpoll", "latency: consumers measured, comma-separated (ws, sse, longpoll)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "latency and throughput: how long each run measures")
	fs.IntVar(&cfg.IdleWS, "idle-ws", 10000, "idle: WebSocket connections")
	fs.IntVar(&cfg.IdleSSE, "idle-sse", 10000, "idle: SSE connections")
	fs.IntVar(&cfg.IdleLP, "idle-longpoll", 1000, "idle: long-poll connections (each asks again when its 30 s wait ends)")
	fs.DurationVar(&cfg.IdleFor, "idle-for", 10*time.Second, "idle: how long CPU and queries are measured")
	fs.IntVar(&cfg.TputRate, "tput-rate", 10000, "throughput: messages per second pushed while the consumer runs")
	fs.DurationVar(&cfg.MatrixFor, "matrix-for", 5*time.Second, "throughput: how long each of the 12 batch × partitions × groups runs lasts (0 skips them)")
	fs.IntVar(&cfg.Holders, "holders", 4, "idle and connections: child processes that hold the connections")
	fs.IntVar(&cfg.Connections, "connections", 20000, "connections: how many to ramp to, in four steps (half WebSocket, half SSE)")
	fs.IntVar(&cfg.RestartPartitions, "restart-partitions", 9000, "restart: partitions with one message each, and as many subscriptions naming one (100 per WebSocket)")
	fs.BoolVar(&cfg.RestartKill, "restart-kill", false, "restart: kill herald (SIGKILL) instead of SIGTERM; the new life gives the leases back at start")
	fs.StringVar(&cfg.RestartProfile, "restart-profile", "", "restart: write a 10 s CPU profile of the restarted instance (from its --pprof-addr) to this file")
	fanout := fs.String("fanout", "10000@10,1000@100", "fanout: FOLLOWERS@RATE cases, comma-separated: SSE followers of one queue on one instance, single-message pushes per second for --duration")
	fanoutCluster := fs.String("fanout-cluster", "10000@10", "fanout: FOLLOWERS@RATE cases on three instances (syncnet on), followers spread evenly, pushes to the first; empty runs none")
	fs.StringVar(&cfg.FanoutProfile, "fanout-profile", "", "fanout: write a CPU profile of herald (--pprof-addr) during each single-instance case's pushes to PREFIX-FOLLOWERS@RATE.pprof")
	fs.StringVar(&cfg.DSN, "dsn", "", "groups: the server's PostgreSQL (a connection string), to measure the WAL per push; empty skips it")
	drainParts := fs.String("drain-partitions", "200,2000,5000", "drain: partition counts, one message in each, drained by HTTP pops and by one WebSocket subscription")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: herald-bench [flags] [latency] [throughput] [idle] [connections] [cluster] [drain] [fanout] [restart] [mesh] [groups]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.LatencyPartitions < 1 || cfg.LatencyPartitions > 1000 {
		fmt.Fprintf(stderr, "herald-bench: --latency-partitions: %d is not between 1 and 1000\n", cfg.LatencyPartitions)
		return 2
	}
	for _, t := range strings.Split(*latTransports, ",") {
		t = strings.TrimSpace(t)
		if t != "ws" && t != "sse" && t != "longpoll" {
			fmt.Fprintf(stderr, "herald-bench: --latency-transports: %q is none of ws, sse, longpoll\n", t)
			return 2
		}
		cfg.LatencyTransports = append(cfg.LatencyTransports, t)
	}
	for _, f := range strings.Split(*drainParts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1000000 {
			fmt.Fprintf(stderr, "herald-bench: --drain-partitions: %q is not a count between 1 and 1000000\n", f)
			return 2
		}
		cfg.DrainPartitions = append(cfg.DrainPartitions, n)
	}
	var err error
	if cfg.FanoutCases, err = fanoutload.ParseCases(*fanout); err != nil {
		fmt.Fprintf(stderr, "herald-bench: --fanout: %v\n", err)
		return 2
	}
	if cfg.FanoutCluster, err = fanoutload.ParseCases(*fanoutCluster); err != nil {
		fmt.Fprintf(stderr, "herald-bench: --fanout-cluster: %v\n", err)
		return 2
	}
	scenarios := fs.Args()
	if len(scenarios) == 0 {
		// idle first: its memory baseline is the fresh server.
		scenarios = []string{"idle", "connections", "latency", "throughput", "drain", "cluster", "fanout"}
	}
	// The cluster, fanout, restart and mesh scenarios start servers of their own.
	needTarget := false
	for _, s := range scenarios {
		if s != "latency" && s != "throughput" && s != "idle" && s != "cluster" && s != "connections" && s != "drain" &&
			s != "fanout" && s != "restart" && s != "mesh" && s != "groups" {
			fmt.Fprintf(stderr, "herald-bench: unknown scenario %q\n", s)
			return 2
		}
		needTarget = needTarget || s != "cluster" && s != "fanout" && s != "restart" && s != "mesh"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	wakes := strings.Split(cfg.Wake, ",")
	if cfg.URL != "" && len(wakes) > 1 {
		fmt.Fprintln(stderr, "herald-bench: a list of --wake modes needs servers it starts (no --url)")
		return 2
	}
	cfg.Wake = wakes[0]

	rep := &report{Machine: machine(), Started: time.Now().UTC(), Settings: cfg}
	target := &server{url: cfg.URL, pid: cfg.PID}
	if cfg.URL == "" && needTarget {
		srv, err := startServer(ctx, cfg, stderr)
		if err != nil {
			fmt.Fprintln(stderr, "herald-bench:", err)
			return 1
		}
		defer srv.stop()
		target = srv
	}
	if target.url != "" {
		progress(stderr, "measuring %s (%s)", target.url, rep.Machine)
	}
	for _, s := range scenarios {
		if why, own := ownInstances[s]; own && cfg.URL != "" {
			fmt.Fprintf(stderr, "herald-bench: %s: the %s scenario %s (no --url)\n", s, s, why)
			return 1
		}
		var err error
		switch s {
		case "latency":
			rep.Latency, err = runLatency(ctx, target, cfg, stderr)
			if err == nil && len(wakes) > 1 {
				var more []latencyResult
				more, err = runWakes(ctx, cfg, wakes[1:], stderr)
				rep.Latency = append(rep.Latency, more...)
			}
		case "cluster":
			rep.Cluster, err = runCluster(ctx, cfg, stderr)
		case "mesh":
			rep.Mesh, err = runMesh(ctx, cfg, stderr)
		case "throughput":
			rep.Throughput, err = runThroughput(ctx, target, cfg, stderr)
		case "drain":
			rep.Drain, err = runDrain(ctx, target, cfg, stderr)
		case "restart":
			rep.Restart, err = runRestart(ctx, cfg, stderr)
		case "groups":
			rep.Groups, err = runGroups(ctx, target, cfg, stderr)
		case "idle":
			rep.Idle, err = runIdle(ctx, target, cfg, stderr)
		case "fanout":
			rep.Fanout, err = runFanout(ctx, target, cfg, stderr)
		case "connections":
			// A fresh server: one that held connections before keeps
			// their memory, which would hide what the ramp costs.
			ramp := target
			if cfg.URL == "" {
				if ramp, err = startServer(ctx, cfg, stderr); err != nil {
					break
				}
			}
			rep.Connections, err = runConnections(ctx, ramp, cfg, stderr)
			if ramp != target {
				ramp.stop()
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "herald-bench: %s: %v\n", s, err)
			return 1
		}
	}
	rep.print(stdout)
	if cfg.Out != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.Out, b, 0o600); err != nil {
			fmt.Fprintln(stderr, "herald-bench:", err)
			return 1
		}
		html := strings.TrimSuffix(cfg.Out, ".json") + ".html"
		if err := os.WriteFile(html, rep.html(), 0o600); err != nil {
			fmt.Fprintln(stderr, "herald-bench:", err)
			return 1
		}
		progress(stderr, "results written to %s and %s", cfg.Out, html)
	}
	return 0
}

func progress(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "[%s] %s\n", time.Now().Format(time.TimeOnly), fmt.Sprintf(format, args...))
}

// machine describes where the figures come from.
func machine() string {
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		for _, line := range strings.Split(string(b), "\n") {
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s, %s/%s, %s", runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
