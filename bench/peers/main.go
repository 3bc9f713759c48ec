// Command peers measures Herald side by side with NATS JetStream,
// centrifuge and River on this machine: push → receipt latency and the CPU
// the server (and PostgreSQL) spends per 1,000 messages, at a few rates of
// single-message pushes, one consumer acking each message, rounds
// interleaved so that machine noise hits every system alike. It prints a
// markdown table of the medians and the ratios to Herald.
//
//	peers --herald ../../bin/herald [--rounds 3] [--rates 200,1000] [--duration 5s]
//
// It starts one PostgreSQL (fsync and synchronous_commit on) for Herald
// and River, in databases of their own, and runs every server in a process
// of its own so that its CPU time is its own: herald as a binary, the
// embedded nats-server and centrifuge node as children of this binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// system is one peer under measurement.
type system interface {
	name() string
	run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error)
	close()
}

func main() {
	if len(os.Args) > 2 && os.Args[1] == "child" {
		if err := runChild(os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, "peers child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func runChild(kind string, args []string) error {
	switch kind {
	case "nats":
		return childNATS(args)
	case "centrifuge":
		return childCentrifuge()
	case "river":
		return childRiver(args)
	}
	return fmt.Errorf("unknown child %q", kind)
}

type config struct {
	herald   string
	rounds   int
	rates    []int
	warm     time.Duration
	duration time.Duration
	systems  []string
	out      string
}

var allSystems = []string{"herald", "herald-sse", "herald-longpoll", "nats", "nats-sync", "centrifuge", "river"}

func run(args []string, stdout, stderr io.Writer) error {
	var cfg config
	var rates, systems string
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.herald, "herald", "../../bin/herald", "herald binary (make build writes bin/herald)")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every system at every rate, and the table shows medians")
	fs.StringVar(&rates, "rates", "200,1000", "comma-separated push rates, messages per second")
	fs.DurationVar(&cfg.warm, "warm", time.Second, "warm-up at the start of each measurement, not counted in the latencies")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured part of each measurement")
	fs.StringVar(&systems, "systems", strings.Join(allSystems, ","), "comma-separated systems to run, of "+strings.Join(allSystems, ","))
	fs.StringVar(&cfg.out, "out", "", "also write the markdown table to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for r := range strings.SplitSeq(rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			return fmt.Errorf("--rates: %q is not a positive number", r)
		}
		cfg.rates = append(cfg.rates, n)
	}
	cfg.systems = strings.Split(systems, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary: %w", err)
	}
	load0 := loadAvg()
	started := time.Now()
	sys, cleanup, err := startAll(ctx, cfg, self, stderr)
	defer cleanup()
	if err != nil {
		return err
	}
	// results[system][rate] holds one sample per round.
	results := map[string]map[int][]sample{}
	for round := 1; round <= cfg.rounds; round++ {
		for _, rate := range cfg.rates {
			for _, s := range sys {
				fmt.Fprintf(stderr, "round %d/%d: %s at %d msgs/s … ", round, cfg.rounds, s.name(), rate)
				sm, err := s.run(ctx, rate, cfg.warm, cfg.duration)
				if err != nil && ctx.Err() != nil {
					return ctx.Err()
				}
				if err != nil {
					fmt.Fprintf(stderr, "error: %v\n", err)
				} else {
					fmt.Fprintf(stderr, "p50 %.2f ms, p99 %.2f ms, %.3f CPU s/1k (%d/%d)\n", sm.P50, sm.P99, sm.CPUPer1k,
						sm.Received, sm.Pushed)
				}
				if results[s.name()] == nil {
					results[s.name()] = map[int][]sample{}
				}
				if err == nil {
					results[s.name()][rate] = append(results[s.name()][rate], sm)
				}
			}
		}
	}
	table := report(cfg, sys, results, load0, loadAvg(), time.Since(started))
	_, _ = io.WriteString(stdout, table)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(table), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", cfg.out, err)
		}
	}
	return nil
}

// startAll starts PostgreSQL (when herald or river runs) and every system;
// cleanup stops whatever started.
func startAll(ctx context.Context, cfg config, self string, log io.Writer) ([]system, func(), error) {
	var sys []system
	var pg *postgres
	var hs *heraldSys // one herald process serves every Herald row
	cleanup := func() {
		for _, s := range sys {
			s.close()
		}
		if pg != nil {
			pg.stop()
		}
	}
	for _, name := range cfg.systems {
		if (strings.HasPrefix(name, "herald") || name == "river") && pg == nil {
			fmt.Fprintln(log, "starting PostgreSQL (fsync on, synchronous_commit on)")
			p, err := startPostgres(ctx)
			if err != nil {
				return nil, cleanup, err
			}
			pg = p
		}
		fmt.Fprintf(log, "starting %s\n", name)
		var s system
		var err error
		switch name {
		case "herald", "herald-sse", "herald-longpoll":
			if hs == nil {
				hs, err = startHerald(ctx, cfg.herald, pg)
				if err != nil {
					break
				}
			}
			hs.refs++
			switch name {
			case "herald":
				s = hs
			case "herald-sse":
				s = newHeraldSSE(hs)
			default:
				s = newHeraldLongPoll(hs)
			}
		case "nats":
			s, err = startNATS(ctx, self, false)
		case "nats-sync":
			s, err = startNATS(ctx, self, true)
		case "centrifuge":
			s, err = startCentrifuge(ctx, self)
		case "river":
			s, err = startRiver(ctx, self, pg)
		default:
			err = errors.New("unknown system " + name)
		}
		if err != nil {
			return sys, cleanup, fmt.Errorf("starting %s: %w", name, err)
		}
		sys = append(sys, s)
	}
	return sys, cleanup, nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
