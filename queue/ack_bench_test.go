package queue_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/heraldmq/herald/queue"
)

// BenchmarkAckInOrder acks the messages of one lease one at a time, in
// order, each in a call of its own: a consumer that keeps up with one
// partition. The lease (1,000 messages) is pushed and taken outside the
// timer. Reports statements per ack, and the CPU per ack of PostgreSQL (every
// process of the test cluster: fsync is off there) and of this process.
func BenchmarkAckInOrder(b *testing.B) {
	s := newStore(b)
	ctx := context.Background()
	var pending []queue.Message
	lease := func() {
		items := make([]queue.PushItem, 1000)
		for i := range items {
			items[i] = queue.PushItem{Queue: "bench", Partition: "p", Payload: benchPayload}
		}
		if _, err := s.Push(ctx, items); err != nil {
			b.Fatal(err)
		}
		res, err := s.Pop(ctx, queue.PopRequest{Queue: "bench", Partition: "p", Batch: 1000})
		if err != nil || len(res.Messages) != 1000 {
			b.Fatalf("pop: %v, %d messages", err, len(res.Messages))
		}
		pending = res.Messages
	}
	var pgPID int
	if err := s.Pool().QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pgPID); err != nil {
		b.Fatal(err)
	}
	postmaster := parentPID(b, pgPID)
	stats := s.QueryStats()
	lease()
	before := stats.Snapshot()
	pg0, self0 := clusterCPU(b, postmaster), selfCPU()
	var paused time.Duration // PostgreSQL's CPU while the timer was stopped
	for b.Loop() {
		if len(pending) == 0 {
			b.StopTimer()
			t0 := clusterCPU(b, postmaster)
			lease()
			paused += clusterCPU(b, postmaster) - t0
			b.StartTimer()
		}
		m := pending[0]
		pending = pending[1:]
		out, err := s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}})
		if err != nil || !out[0].Success {
			b.Fatalf("ack: %v %+v", err, out)
		}
	}
	pg, self := clusterCPU(b, postmaster)-pg0-paused, selfCPU()-self0
	after := stats.Snapshot()
	var stmts uint64
	for op, n := range after {
		if !strings.HasPrefix(op, "push_") && op != "pop_assigned" && op != "resolve_partitions" {
			stmts += n - before[op]
		}
	}
	b.ReportMetric(float64(stmts)/float64(b.N), "stmts/ack")
	b.ReportMetric(float64(pg.Microseconds())/float64(b.N), "pg_µs/ack")
	b.ReportMetric(float64(self.Microseconds())/float64(b.N), "self_µs/ack")
}

// parentPID is pid's parent process.
func parentPID(b *testing.B, pid int) int {
	st := procStat(b, pid)
	ppid, err := strconv.Atoi(st[1])
	if err != nil {
		b.Fatal(err)
	}
	return ppid
}

// procStat is /proc/pid/stat's fields after the command (field 3 on).
func procStat(b *testing.B, pid int) []string {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
}

// clusterCPU is the user and system CPU of the postmaster and its
// children so far.
func clusterCPU(b *testing.B, postmaster int) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var ticks int64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(raw)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if pid != postmaster && f[1] != strconv.Itoa(postmaster) {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + k
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ 100
}

// selfCPU is this process's user and system CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
