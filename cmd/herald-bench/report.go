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
		table(w, fmt.Sprintf("\n%s at %d msgs/s for %v (first two seconds are warm-up)", part.title, r.Settings.Rate, r.Settings.Duration),
			"setup\twake\ttransport\tpartitions\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\treceived\tdups\therald CPU %\tCPU s/1k (herald+PG)\tstatements/msg\tmachine busy %\tof it others' %\t",
			len(part.rows), func(tw io.Writer, i int) {
				l := part.rows[i]
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d/%d\t%d\t%.0f\t%s\t%.2f\t%.0f\t%.0f\t\n",
					l.Setup, l.Wake, l.Transport, l.Partitions, l.P50, l.P90, l.P99, l.P999, l.Max, l.Received, l.Pushed, l.Duplicates, l.ServerCPU,
					cpuPer1k(l.CPUPer1k), l.StatementsPerMsg, l.MachineBusy, l.OthersBusy)
			})
	}
	if len(r.Throughput) > 0 {
		table(w, "\nend-to-end throughput (push over HTTP, WebSocket delivery, batched acks)",
			"phase\tbatch\tpartitions\tgroups\tpushed/s\tdelivered/s per group\tacked/s per group\tbacklog\t",
			len(r.Throughput), func(tw io.Writer, i int) {
				t := r.Throughput[i]
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%d\t\n", t.Phase, t.Batch, t.Partitions, max(t.Groups, 1),
					t.PushedPerSec, t.DeliveredPerS, t.AckedPerSec, t.Backlog)
			})
	}
	if len(r.Drain) > 0 {
		table(w, "\nmany-partition drain (one message in each partition, one wildcard consumer; batch 10)",
			"partitions\ttransport\tdrained\tseconds\tmsgs/s\t", len(r.Drain), func(tw io.Writer, i int) {
				d := r.Drain[i]
				fmt.Fprintf(tw, "%d\t%s\t%d\t%.1f\t%.0f\t\n", d.Partitions, d.Transport, d.Drained, d.Seconds, d.PerSec)
			})
	}
	if x := r.Restart; x != nil {
		table(w, fmt.Sprintf("\nrestart (%s): %d partition subscriptions on %d WebSockets, each holding its message", x.Signal, x.Partitions, x.Sockets),
			"down s\tredelivered\tp50 s\tp99 s\tmax s\therald CPU s\tpg CPU s\tload\t", 1, func(tw io.Writer, _ int) {
				fmt.Fprintf(tw, "%.1f\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%s\t\n", x.DownSeconds, x.Redelivered, x.P50, x.P99, x.Max,
					x.CPUSeconds, x.PGCPU, x.Load)
			})
	}
	if len(r.Fanout) > 0 {
		table(w, fmt.Sprintf("\nfanout: SSE followers of one queue, single-message pushes for %v, one at a time (first two seconds are warm-up)", r.Settings.Duration),
			"setup\tfollowers\tmsgs/s\tdeliveries in order\tout of order\tlost\tp50 ms\tp90 ms\tp99 ms\tmax ms\tCPU s/1k deliveries (herald+PG)\therald alone\tfollowers' CPU\tidle KB/follower RSS\theap\tload\t",
			len(r.Fanout), func(tw io.Writer, i int) {
				f := r.Fanout[i]
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d/%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.4f\t%.4f\t%.4f\t%.1f\t%.1f\t%s\t\n", f.Setup, f.Followers, f.Rate,
					f.Received, f.Expected, f.Violations, f.Losses, f.P50, f.P90, f.P99, f.Max, f.CPUPer1k, f.HeraldCPUPer1k,
					f.ClientCPUPer1k, f.RSSPerFollower/1024, f.HeapPerFollower/1024, f.Load)
			})
	}
	if len(r.Connections) > 0 {
		table(w, "\nconnection ramp (half WebSocket, half SSE)", "connections\tconnects/s\tRSS MiB\tKB/conn\t",
			len(r.Connections), func(tw io.Writer, i int) {
				c := r.Connections[i]
				fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.1f\t\n", c.Connections, c.ConnectPerSec, float64(c.RSS)/(1<<20), c.BytesPerConn/1024)
			})
	}
	if r.Groups != nil {
		printGroups(w, r.Groups)
	}
	if i := r.Idle; i != nil {
		table(w, "\nidle connections",
			"ws\tsse\tlong-poll\tconnects/s\tRSS before MiB\tafter connect MiB\tsettled MiB\tKB/conn\tidle CPU %\tqueries/s\t",
			1, func(tw io.Writer, _ int) {
				fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t\n", i.WS, i.SSE, i.LongPoll, i.ConnectPerSec,
					float64(i.RSSBefore)/(1<<20), float64(i.RSSAfter)/(1<<20), float64(i.RSSSettled)/(1<<20),
					i.BytesPerConn/1024, i.CPUPercent, i.QueriesPerSec)
			})
		fmt.Fprintln(w, "KB/conn = (settled RSS − RSS before) / connections; settled = at the end of the idle window")
		if i.FileLimitNote != "" {
			fmt.Fprintln(w, "note:", i.FileLimitNote)
		}
	}
}

// table prints title, then header and n rows (row writes row i) in
// right-aligned columns.
func table(w io.Writer, title, header string, n int, row func(tw io.Writer, i int)) {
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, header)
	for i := range n {
		row(tw, i)
	}
	_ = tw.Flush()
}

// cpuPer1k shows CPU seconds per 1,000 messages, "-" when not measured.
func cpuPer1k(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}
