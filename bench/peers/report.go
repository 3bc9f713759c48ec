package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/heraldmq/herald/internal/fanoutload"
)

// describe says what each system is and how durable a push is when it
// returns.
var describe = map[string]string{
	"herald":          "Herald (PostgreSQL, fsync + synchronous commit on; WebSocket via the Go SDK, acks on the socket)",
	"herald-sse":      "Herald, SSE consumer (same server; EventSource-style reader, acks batched per POST /api/v1/ack/batch)",
	"herald-longpoll": "Herald, long-poll consumer (same server; GET /api/v1/pop wait=true batch=10 partitions=N, the settings' partitions, one ack/batch per pop)",
	"nats":            "NATS JetStream 2.15.2 (file storage, default fsync every 2 min; explicit acks)",
	"nats-sync":       "NATS JetStream 2.15.2 (file storage, sync_interval: always; explicit acks)",
	"centrifuge":      "centrifuge 0.40.1 (memory broker, WebSocket; no acks, at most once; fanout: SSE transport)",
	"river":           "River 0.51.1 (same PostgreSQL; 100 workers, job completion as the ack)",
	"pg-floor": "pg-floor, the floor of a queue in PostgreSQL (same PostgreSQL; per push one INSERT committed before the 201, " +
		"handed from memory to the consumer's WebSocket; one DELETE per ack frame; nothing else: pgfloor.go)",
	"pg-floor-async-ack": "pg-floor with its acks' DELETEs committed without waiting for the WAL flush (synchronous_commit off " +
		"for them; a lost ack is a redelivery)",
}

// medianOf is the median of one field over the rounds.
func medianOf[T any](ss []T, f func(T) float64) float64 {
	if len(ss) == 0 {
		return 0
	}
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func ratio(v, base float64) string {
	if base == 0 || v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v/base)
}

func report(cfg config, sys []system, res map[string]map[int][]sample, e2es map[string]map[int][]e2eSample,
	fanouts map[string]map[fanoutload.Case][]fanoutSample, load0, load1 string, took time.Duration) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), load average %s before and %s after, %s, %s/%s, %s; host %s. "+
		"Run took %v.\n\n",
		runtime.NumCPU(), cpuModel(), load0, load1, runtime.Version(), runtime.GOOS, runtime.GOARCH,
		time.Now().UTC().Format("2006-01-02"), host, took.Round(time.Second))
	if cfg.latency() {
		reportLatency(&b, cfg, sys, res)
	}
	if cfg.e2e() {
		if cfg.latency() {
			b.WriteString("\n")
		}
		reportE2E(&b, cfg, sys, e2es)
	}
	if cfg.fanout() {
		reportFanout(&b, cfg, sys, fanouts)
	}
	return b.String()
}

func reportLatency(b *strings.Builder, cfg config, sys []system, res map[string]map[int][]sample) {
	fmt.Fprintf(b, "Latency. Settings: single-message pushes of %d-byte payloads at %s msgs/s from a pool of 16 producers "+
		"(Herald and pg-floor: HTTP POST /api/v1/push over %s; NATS: JetStream publish awaiting the stream's ack; "+
		"centrifuge: HTTP publish endpoint calling Node.Publish; River: Client.Insert), one consumer; "+
		"%v warm-up then %v measured per run; %d rounds interleaved (%s), medians shown. "+
		"CPU is user+system seconds of the server process (NATS and centrifuge: an embedded server in a child process of its own; "+
		"River: the worker client's process) plus, for Herald, River and pg-floor, all processes of the shared PostgreSQL, "+
		"from the first push to the last receipt, divided by the messages pushed.\n\n",
		payloadSize, joinInts(cfg.rates), partitionsLabel(cfg.partitions), cfg.warm, cfg.duration, cfg.rounds, strings.Join(cfg.systems, ", "))
	writeHead(b, cfg.rates, func(r int) []string {
		return []string{fmt.Sprintf("%d msgs/s: p50 / p99 ms", r), fmt.Sprintf("%d msgs/s: CPU s per 1,000 (server + PG)", r)}
	})
	p50 := func(s sample) float64 { return s.P50 }
	p99 := func(s sample) float64 { return s.P99 }
	for _, s := range sys {
		fmt.Fprintf(b, "| %s |", describe[s.name()])
		for _, r := range cfg.rates {
			ss := res[s.name()][r]
			if len(ss) == 0 {
				b.WriteString(" failed | failed |")
				continue
			}
			fmt.Fprintf(b, " %.2f / %.2f | %s |", medianOf(ss, p50), medianOf(ss, p99), cpuCell(ss, 3))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nRatio to Herald (the system's figure ÷ Herald's; below 1 means less latency or CPU than Herald):\n\n")
	writeRatios(b, sys, cfg.rates, func(r int) string { return fmt.Sprintf("%d/s", r) }, res,
		figure[sample]{"p50", p50}, figure[sample]{"p99", p99}, figure[sample]{"CPU", cpuOf[sample]})
}

// partitionsLabel says how many partitions the pushes go to.
func partitionsLabel(n int) string {
	if n == 1 {
		return "1 partition"
	}
	return fmt.Sprintf("%d partitions, round robin", n)
}

// cpuCell is the median CPU figure of rounds ss (total, seconds per 1,000
// messages) with digits decimals and, when PostgreSQL's part shows at
// that precision, the server's and PostgreSQL's parts of it:
// "0.123 (0.100 + 0.023)".
func cpuCell[T costed](ss []T, digits int) string {
	c, sc := medianOf(ss, cpuOf[T]), medianOf(ss, func(s T) float64 { return s.cost().ServerCPU })
	if c-sc > 0.5*math.Pow10(-digits) {
		return fmt.Sprintf("%.*f (%.*f + %.*f)", digits, c, digits, sc, digits, c-sc)
	}
	return fmt.Sprintf("%.*f", digits, c)
}

// writeHead writes a table's heading row and its rule: "system", then the
// columns heads gives for each key in turn.
func writeHead(b *strings.Builder, keys []int, heads func(k int) []string) {
	b.WriteString("| system |")
	n := 0
	for _, k := range keys {
		h := heads(k)
		for _, c := range h {
			fmt.Fprintf(b, " %s |", c)
		}
		n += len(h)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", n) + "\n")
}

// figure is one column of a ratio table: its heading (after the column
// key's label) and the field of a round it reads.
type figure[T any] struct {
	head string
	of   func(T) float64
}

// writeRatios writes the table of each system's figures ÷ Herald's, of
// the medians over the rounds res holds per system and key: a column per
// key and figure, a row per system but Herald.
func writeRatios[T any](b *strings.Builder, sys []system, keys []int, label func(int) string,
	res map[string]map[int][]T, figs ...figure[T]) {
	writeHead(b, keys, func(k int) []string {
		heads := make([]string, len(figs))
		for i, f := range figs {
			heads[i] = label(k) + " " + f.head
		}
		return heads
	})
	base := res["herald"]
	for _, s := range sys {
		if s.name() == "herald" {
			continue
		}
		fmt.Fprintf(b, "| %s |", s.name())
		for _, k := range keys {
			for _, f := range figs {
				fmt.Fprintf(b, " %s |", ratio(medianOf(res[s.name()][k], f.of), medianOf(base[k], f.of)))
			}
		}
		b.WriteString("\n")
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, " and ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
