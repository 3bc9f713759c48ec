// Command peers measures Herald side by side with NATS JetStream,
// centrifuge and River on this machine, in two scenarios, rounds
// interleaved so that machine noise hits every system alike, and prints
// markdown tables of the medians and the ratios to Herald.
//
// The latency scenario measures push → receipt latency and the CPU the
// server (and PostgreSQL) spends per 1,000 messages, at a few rates of
// single-message pushes, one consumer acking each message. The e2e
// scenario measures end-to-end throughput: 4 producers push batches of 100
// as fast as a backlog of at most 10,000 allows, one consumer per consumer
// group acks each message, with 1 and with 5 groups; it reports the
// messages delivered and acked per second and the CPU per 1,000 of them.
// The fanout scenario (only when asked for) measures one stream broadcast
// to N SSE clients, Herald's follow stream against centrifuge's SSE
// transport: every client must get every message in order; latency per
// delivery and CPU per 1,000 deliveries (fanout.go); a bare server that
// only writes each frame to every socket is measured beside them, the
// floor of this machine (floor.go).
//
//	peers --herald ../../bin/herald [--scenario all|latency|e2e|fanout] [--rounds 3]
//		[--rates 200,1000] [--duration 5s] [--partitions 16] [--e2e-groups 1,5] [--e2e-duration 10s]
//		[--fanout 10000@10,1000@100] [--fanout-duration 10s] [--fanout-floor=false]
//
// The latency scenario also measures pg-floor (pgfloor.go), the least a
// queue in PostgreSQL with Herald's transports can do per message: an
// INSERT per push and a DELETE per ack frame, each committed
// synchronously, the message handed to the consumer's WebSocket from
// memory.
//
// It starts one PostgreSQL (fsync and synchronous_commit on) for Herald,
// River and pg-floor, in databases of their own, and runs every server in a process
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/internal/fanoutload"
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
	case "floor":
		return childFloor(args)
	case "river":
		return childRiver(args)
	case "pg-floor":
		return childPGFloor(args)
	case "followers":
		if rc := fanoutload.RunFollowers(args); rc != 0 {
			return fmt.Errorf("followers exited %d", rc)
		}
		return nil
	}
	return fmt.Errorf("unknown child %q", kind)
}

type config struct {
	herald      string
	scenario    string // all, latency or e2e
	rounds      int
	rates       []int
	warm        time.Duration
	duration    time.Duration
	e2eGroups   []int
	e2eWarm     time.Duration
	e2eDuration time.Duration
	systems     []string
	out         string
	// partitions: the latency scenario's partitions (Herald, pg-floor).
	partitions int
	// fanoutCases and fanoutDuration: the fanout scenario's followers @
	// rates and measured part.
	fanoutCases    []fanoutload.Case
	fanoutDuration time.Duration
}

func (c config) latency() bool { return c.scenario == "all" || c.scenario == "latency" }
func (c config) e2e() bool     { return c.scenario == "all" || c.scenario == "e2e" }
func (c config) fanout() bool  { return c.scenario == "fanout" }

var allSystems = []string{"herald", "herald-sse", "herald-longpoll", "nats", "nats-sync", "centrifuge", "river", "pg-floor"}

// maxPartitions bounds --partitions.
const maxPartitions = 1000

func run(args []string, stdout, stderr io.Writer) error {
	var cfg config
	var rates, groups, systems string
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.herald, "herald", "../../bin/herald", "herald binary (make build writes bin/herald)")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every system at every rate, and the table shows medians")
	fs.StringVar(&rates, "rates", "200,1000", "comma-separated push rates, messages per second")
	fs.DurationVar(&cfg.warm, "warm", time.Second, "warm-up at the start of each measurement, not counted in the latencies")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured part of each measurement")
	fs.IntVar(&cfg.partitions, "partitions", 16, fmt.Sprintf("latency: partitions the pushes are spread over, round robin, for Herald's rows and pg-floor (1-%d; the e2e scenario keeps 16)", maxPartitions))
	fs.StringVar(&systems, "systems", strings.Join(allSystems, ","), "comma-separated systems to run, of "+strings.Join(allSystems, ",")+"; also pg-floor-async-ack, pg-floor with its acks committed asynchronously (fanout: herald, centrifuge and floor-sync, the first floor: its push answered once every socket is written, its frame the payload alone)")
	fs.StringVar(&cfg.out, "out", "", "also write the markdown tables to this file")
	fs.StringVar(&cfg.scenario, "scenario", "all", "latency (paced single pushes), e2e (end-to-end throughput), all (both), or fanout (N SSE followers of one stream; herald and centrifuge)")
	fanout := fs.String("fanout", "10000@10,1000@100", "fanout: comma-separated FOLLOWERS@RATE cases")
	floor := fs.Bool("fanout-floor", true, "fanout: also measure the floor, a bare server writing each frame to every socket (floor.go)")
	fs.DurationVar(&cfg.fanoutDuration, "fanout-duration", 10*time.Second, "fanout: measured part of each measurement (after --warm)")
	fs.StringVar(&groups, "e2e-groups", "1,5", "e2e: comma-separated numbers of consumer groups")
	fs.DurationVar(&cfg.e2eWarm, "e2e-warm", 2*time.Second, "e2e: warm-up of each measurement, not counted")
	fs.DurationVar(&cfg.e2eDuration, "e2e-duration", 10*time.Second, "e2e: measured part of each measurement")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.scenario != "all" && cfg.scenario != "latency" && cfg.scenario != "e2e" && cfg.scenario != "fanout" {
		return fmt.Errorf("--scenario: %q is not latency, e2e, all or fanout", cfg.scenario)
	}
	if cfg.partitions < 1 || cfg.partitions > maxPartitions {
		return fmt.Errorf("--partitions: %d is not between 1 and %d", cfg.partitions, maxPartitions)
	}
	var err error
	if cfg.fanoutCases, err = fanoutCases(*fanout); err != nil {
		return fmt.Errorf("--fanout: %w", err)
	}
	if cfg.rates, err = positiveInts(rates); err != nil {
		return fmt.Errorf("--rates: %w", err)
	}
	if cfg.e2eGroups, err = positiveInts(groups); err != nil {
		return fmt.Errorf("--e2e-groups: %w", err)
	}
	cfg.systems = strings.Split(systems, ",")
	if cfg.fanout() {
		// Only the systems with a broadcast to SSE clients.
		cfg.systems = slices.DeleteFunc(cfg.systems, func(n string) bool {
			return n != "herald" && n != "centrifuge" && n != "floor-sync"
		})
		if *floor {
			cfg.systems = append(cfg.systems, "floor")
		}
	} else if !cfg.latency() {
		// Only the systems the e2e scenario has a row for.
		cfg.systems = slices.DeleteFunc(cfg.systems, func(n string) bool { return e2eOmitted[n] != "" })
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary: %w", err)
	}
	load0 := fanoutload.LoadAverage()
	started := time.Now()
	sys, cleanup, err := startAll(ctx, cfg, self, stderr)
	defer cleanup()
	if err != nil {
		return err
	}
	// results[system][rate] and e2es[system][groups] hold one sample per
	// round.
	results := map[string]map[int][]sample{}
	e2es := map[string]map[int][]e2eSample{}
	fanouts := map[string]map[fanoutload.Case][]fanoutSample{}
	for round := 1; round <= cfg.rounds; round++ {
		for _, rate := range cfg.rates {
			if !cfg.latency() {
				break
			}
			for _, s := range sys {
				fmt.Fprintf(stderr, "round %d/%d: %s at %d msgs/s … ", round, cfg.rounds, s.name(), rate)
				if err := keep(ctx, stderr, results, s.name(), rate, func() (sample, error) {
					return s.run(ctx, rate, cfg.warm, cfg.duration)
				}, func(sm sample) string {
					return fmt.Sprintf("p50 %.2f ms, p99 %.2f ms, %.3f CPU s/1k (%d/%d)", sm.P50, sm.P99, sm.CPUPer1k,
						sm.Received, sm.Pushed)
				}); err != nil {
					return err
				}
			}
		}
		if err := runE2E(ctx, cfg, round, sys, e2es, stderr); err != nil {
			return err
		}
		if cfg.fanout() {
			if err := runFanoutRounds(ctx, cfg, self, round, sys, fanouts, stderr); err != nil {
				return err
			}
		}
	}
	table := report(cfg, sys, results, e2es, fanouts, load0, fanoutload.LoadAverage(), time.Since(started))
	_, _ = io.WriteString(stdout, table)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(table), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", cfg.out, err)
		}
	}
	return nil
}

// runE2E runs one round of the end-to-end scenario (when cfg asks for it):
// every system able to, at every number of groups.
func runE2E(ctx context.Context, cfg config, round int, sys []system, res map[string]map[int][]e2eSample,
	log io.Writer) error {
	if !cfg.e2e() {
		return nil
	}
	for _, g := range cfg.e2eGroups {
		for _, s := range sys {
			e, ok := e2eOf(s)
			if !ok || g > e.e2eMaxGroups() {
				continue
			}
			fmt.Fprintf(log, "round %d/%d: %s end to end, %d group(s) … ", round, cfg.rounds, s.name(), g)
			if err := keep(ctx, log, res, s.name(), g, func() (e2eSample, error) {
				return e.e2e(ctx, g, cfg.e2eWarm, cfg.e2eDuration)
			}, func(sm e2eSample) string {
				return fmt.Sprintf("%.0f delivered/s (%.0f pushed/s), %.3f CPU s/1k, load generator %.3f CPU s/1k, %d dups",
					sm.Delivered, sm.Pushed, sm.CPUPer1k, sm.ClientCPU, sm.Dups)
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// keep takes one measurement of system name at key k (a rate, a number of
// groups, a fanout case), logs what it found (show's line) or its error,
// and keeps it in res: a measurement that fails is logged and passed over
// (its round counts as failed in the report), an error once ctx has ended
// is returned and ends the rounds.
func keep[K comparable, T any](ctx context.Context, log io.Writer, res map[string]map[K][]T, name string, k K,
	measure func() (T, error), show func(T) string) error {
	sm, err := measure()
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		fmt.Fprintf(log, "error: %v\n", err)
		return nil
	}
	fmt.Fprintln(log, show(sm))
	if res[name] == nil {
		res[name] = map[K][]T{}
	}
	res[name][k] = append(res[name][k], sm)
	return nil
}

func positiveInts(list string) ([]int, error) {
	var out []int
	for r := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", r)
		}
		out = append(out, n)
	}
	return out, nil
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
		if (strings.HasPrefix(name, "herald") || name == "river" || strings.HasPrefix(name, "pg-floor")) && pg == nil {
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
				hs, err = startHerald(ctx, cfg.herald, pg, cfg.partitions)
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
		case "pg-floor", "pg-floor-async-ack":
			s, err = startPGFloor(ctx, self, pg, cfg.partitions, name == "pg-floor-async-ack")
		case "floor", "floor-sync":
			s, err = startFloor(ctx, self, name == "floor-sync")
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
