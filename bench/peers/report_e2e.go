package main

import (
	"fmt"
	"strings"
)

// e2eOmitted says why a system has no row in the end-to-end table.
var e2eOmitted = map[string]string{
	"herald-sse":         "Herald's SSE and long-poll consumers (the Herald row consumes over WebSocket; they are latency rows only)",
	"herald-longpoll":    "Herald's SSE and long-poll consumers (the Herald row consumes over WebSocket; they are latency rows only)",
	"centrifuge":         "centrifuge, which has no acks and no persistence (at most once to connected clients)",
	"pg-floor":           "pg-floor, the latency scenario's floor (pgfloor.go: single-item pushes only)",
	"pg-floor-async-ack": "pg-floor, the latency scenario's floor (pgfloor.go: single-item pushes only)",
}

// describeE2E says how each system takes part in the end-to-end scenario.
var describeE2E = map[string]string{
	"herald": "Herald (PostgreSQL, fsync + synchronous commit on; POST /api/v1/push of 100 items over 16 partitions; " +
		"per group a WebSocket connection (Go SDK), subscribe with consumerGroup, batch 100, maxInFlight 1,000, ack frames)",
	"nats": "NATS JetStream 2.15.2 (file storage, default fsync every 2 min; 100 PublishAsync awaiting every stream ack; " +
		"per group a durable pull consumer on a connection of its own, explicit acks, MaxAckPending 1,000)",
	"nats-sync": "NATS JetStream 2.15.2 (file storage, sync_interval: always; otherwise as nats)",
	"river": "River 0.51.1 (same PostgreSQL; InsertMany of 100 jobs, 1,000 workers in the worker child, " +
		"job completion as the ack; no consumer groups)",
}

func reportE2E(b *strings.Builder, cfg config, sys []system, res map[string]map[int][]e2eSample) {
	var rows []system
	for _, s := range sys {
		if _, ok := e2eOf(s); ok {
			rows = append(rows, s)
		}
	}
	fmt.Fprintf(b, "End to end. Settings: %d producers pushing batches of %d messages of %d bytes as fast as they are "+
		"confirmed, pausing while the slowest group is more than %d messages behind (so the backlog cannot grow); "+
		"one consumer per consumer group acking each message, every group receiving every message; %s group(s); "+
		"%v warm-up then %v measured per run; %d round(s), each running every system in turn (after the latency rows "+
		"when both scenarios run), medians shown. "+
		"Delivered is the distinct messages delivered to and acked by the consumers per second, all groups together "+
		"(with 5 groups, 5 deliveries per message pushed); pushed is the messages pushed per second. "+
		"CPU is user+system seconds of the server process plus, for Herald and River, all processes of the "+
		"PostgreSQL, over the measured part, per 1,000 messages delivered. After each run the producers stop and "+
		"every group must receive every message pushed (a run that loses one counts as failed).\n\n",
		e2eProducers, e2eBatch, payloadSize, e2eBacklog, joinInts(cfg.e2eGroups), cfg.e2eWarm, cfg.e2eDuration,
		cfg.rounds)
	writeHead(b, cfg.e2eGroups, func(g int) []string {
		return []string{groupsLabel(g) + ": delivered msgs/s (pushed/s), range over rounds",
			groupsLabel(g) + ": CPU s per 1,000 delivered (server + PG)"}
	})
	del := func(s e2eSample) float64 { return s.Delivered }
	push := func(s e2eSample) float64 { return s.Pushed }
	for _, s := range rows {
		fmt.Fprintf(b, "| %s |", describeE2E[s.name()])
		for _, g := range cfg.e2eGroups {
			if e, _ := e2eOf(s); g > e.e2eMaxGroups() {
				b.WriteString(" n/a (no consumer groups) | n/a |")
				continue
			}
			ss := res[s.name()][g]
			if len(ss) == 0 {
				b.WriteString(" failed | failed |")
				continue
			}
			spread := ""
			if len(ss) > 1 {
				lo, hi := spanOf(ss, del)
				spread = fmt.Sprintf(", rounds %.0f–%.0f", lo, hi)
			}
			fmt.Fprintf(b, " %.0f (%.0f)%s | %s |", medianOf(ss, del), medianOf(ss, push), spread, cpuCell(ss, 3))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nRatio to Herald (the system's figure ÷ Herald's; above 1 means more throughput, " +
		"below 1 less CPU per message than Herald):\n\n")
	writeRatios(b, rows, cfg.e2eGroups, func(g int) string { return groupsLabel(g) + ":" }, res,
		figure[e2eSample]{"delivered/s", del}, figure[e2eSample]{"CPU", cpuOf[e2eSample]})
	b.WriteString("\nCPU of this load-generating process (producers and consumers, counted in no figure above), " +
		"seconds per 1,000 delivered, medians:")
	for _, s := range rows {
		for _, g := range cfg.e2eGroups {
			if ss := res[s.name()][g]; len(ss) > 0 {
				fmt.Fprintf(b, " %s %s %.3f;", s.name(), groupsLabel(g),
					medianOf(ss, func(s e2eSample) float64 { return s.ClientCPU }))
			}
		}
	}
	b.WriteString(" on 2 cores a high figure means the run was partly bounded by its load generator.\n")
	fmt.Fprintf(b, "\nNot in this table: %s; %s; %s; River with more than one group: River has no consumer groups "+
		"fanning a job out to several consumers, each job is worked once.\n",
		e2eOmitted["centrifuge"], e2eOmitted["herald-sse"], e2eOmitted["pg-floor"])
}

// spanOf is the least and the greatest of one field over the rounds.
func spanOf(ss []e2eSample, f func(e2eSample) float64) (lo, hi float64) {
	for i, s := range ss {
		v := f(s)
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

func groupsLabel(g int) string {
	if g == 1 {
		return "1 group"
	}
	return fmt.Sprintf("%d groups", g)
}

// e2eOf is s as an e2eRunner, unless it has no row in the end-to-end
// table (the Herald SSE and long-poll rows share the WebSocket row's
// server and would measure it again).
func e2eOf(s system) (e2eRunner, bool) {
	if e2eOmitted[s.name()] != "" {
		return nil, false
	}
	e, ok := s.(e2eRunner)
	return e, ok
}
