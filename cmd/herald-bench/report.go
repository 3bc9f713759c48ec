package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// report is everything one run measured, as printed and as written to JSON.
type report struct {
	Machine     string              `json:"machine"`
	Started     time.Time           `json:"started"`
	Settings    benchConfig         `json:"settings"`
	Idle        *idleResult         `json:"idle,omitempty"`
	Latency     []latencyResult     `json:"latency,omitempty"`
	Cluster     []latencyResult     `json:"cluster,omitempty"`
	Mesh        *meshResult         `json:"mesh,omitempty"`
	Throughput  []throughputResult  `json:"throughput,omitempty"`
	Connections []connectionsResult `json:"connections,omitempty"`
	Drain       []drainResult       `json:"drain,omitempty"`
	Restart     *restartResult      `json:"restart,omitempty"`
	Fanout      []fanoutResult      `json:"fanout,omitempty"`
	Groups      *groupsResult       `json:"groups,omitempty"`
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nherald-bench — %s, wake %s\n", r.Machine, r.Settings.Wake)
	for _, part := range []struct {
		title string
		rows  []latencyResult
	}{{"push → receipt latency", r.Latency}, {"cross-instance latency (push through instance 1)", r.Cluster}} {
		if len(part.rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s at %d msgs/s for %v (first two seconds are warm-up)\n", part.title, r.Settings.Rate, r.Settings.Duration)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "setup\twake\ttransport\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\treceived\tdups\therald CPU %\tCPU s/1k (herald+PG)\t")
		for _, l := range part.rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d/%d\t%d\t%.0f\t%s\t\n",
				l.Setup, l.Wake, l.Transport, l.P50, l.P90, l.P99, l.P999, l.Max, l.Received, l.Pushed, l.Duplicates, l.ServerCPU,
				cpuPer1k(l.CPUPer1k))
		}
		_ = tw.Flush()
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintln(w, "\nend-to-end throughput (push over HTTP, WebSocket delivery, batched acks)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "phase\tbatch\tpartitions\tgroups\tpushed/s\tdelivered/s per group\tacked/s per group\tbacklog\t")
		for _, t := range r.Throughput {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%d\t\n", t.Phase, t.Batch, t.Partitions, max(t.Groups, 1),
				t.PushedPerSec, t.DeliveredPerS, t.AckedPerSec, t.Backlog)
		}
		_ = tw.Flush()
	}
	if len(r.Drain) > 0 {
		fmt.Fprintln(w, "\nmany-partition drain (one message in each partition, one wildcard consumer; batch 10)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "partitions\ttransport\tdrained\tseconds\tmsgs/s\t")
		for _, d := range r.Drain {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%.1f\t%.0f\t\n", d.Partitions, d.Transport, d.Drained, d.Seconds, d.PerSec)
		}
		_ = tw.Flush()
	}
	if x := r.Restart; x != nil {
		fmt.Fprintf(w, "\nrestart (%s): %d partition subscriptions on %d WebSockets, each holding its message\n", x.Signal, x.Partitions, x.Sockets)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "down s	redelivered	p50 s	p99 s	max s	herald CPU s	pg CPU s	load	")
		fmt.Fprintf(tw, "%.1f\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%s\t\n", x.DownSeconds, x.Redelivered, x.P50, x.P99, x.Max,
			x.CPUSeconds, x.PGCPU, x.Load)
		_ = tw.Flush()
	}
	if len(r.Fanout) > 0 {
		fmt.Fprintf(w, "\nfanout: SSE followers of one queue, single-message pushes for %v, one at a time (first two seconds are warm-up)\n", r.Settings.Duration)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "setup\tfollowers\tmsgs/s\tdeliveries in order\tout of order\tlost\tp50 ms\tp90 ms\tp99 ms\tmax ms\tCPU s/1k deliveries (herald+PG)\therald alone\tfollowers' CPU\tidle KB/follower RSS\theap\tload\t")
		for _, f := range r.Fanout {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d/%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.4f\t%.4f\t%.4f\t%.1f\t%.1f\t%s\t\n", f.Setup, f.Followers, f.Rate,
				f.Received, f.Expected, f.Violations, f.Losses, f.P50, f.P90, f.P99, f.Max, f.CPUPer1k, f.HeraldCPUPer1k,
				f.ClientCPUPer1k, f.RSSPerFollower/1024, f.HeapPerFollower/1024, f.Load)
		}
		_ = tw.Flush()
	}
	if len(r.Connections) > 0 {
		fmt.Fprintln(w, "\nconnection ramp (half WebSocket, half SSE)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "connections\tconnects/s\tRSS MiB\tKB/conn\t")
		for _, c := range r.Connections {
			fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.1f\t\n", c.Connections, c.ConnectPerSec, float64(c.RSS)/(1<<20), c.BytesPerConn/1024)
		}
		_ = tw.Flush()
	}
	if r.Groups != nil {
		printGroups(w, r.Groups)
	}
	if i := r.Idle; i != nil {
		fmt.Fprintln(w, "\nidle connections")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "ws\tsse\tlong-poll\tconnects/s\tRSS before MiB\tafter connect MiB\tsettled MiB\tKB/conn\tidle CPU %\tqueries/s\t")
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t\n", i.WS, i.SSE, i.LongPoll, i.ConnectPerSec,
			float64(i.RSSBefore)/(1<<20), float64(i.RSSAfter)/(1<<20), float64(i.RSSSettled)/(1<<20),
			i.BytesPerConn/1024, i.CPUPercent, i.QueriesPerSec)
		fmt.Fprintln(w, "KB/conn = (settled RSS − RSS before) / connections; settled = at the end of the idle window")
		_ = tw.Flush()
		if i.FileLimitNote != "" {
			fmt.Fprintln(w, "note:", i.FileLimitNote)
		}
	}
}

// cpuPer1k shows CPU seconds per 1,000 messages, "-" when not measured.
func cpuPer1k(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}
