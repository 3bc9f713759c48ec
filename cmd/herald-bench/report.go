package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// report is everything one run measured, as printed and as written to JSON.
type report struct {
	Machine    string             `json:"machine"`
	Started    time.Time          `json:"started"`
	Settings   benchConfig        `json:"settings"`
	Idle       *idleResult        `json:"idle,omitempty"`
	Latency    []latencyResult    `json:"latency,omitempty"`
	Throughput []throughputResult `json:"throughput,omitempty"`
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nherald-bench — %s, wake %s\n", r.Machine, r.Settings.Wake)
	if len(r.Latency) > 0 {
		fmt.Fprintf(w, "\npush → receipt latency at %d msgs/s for %v (first two seconds are warm-up)\n", r.Settings.Rate, r.Settings.Duration)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "transport\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\treceived\tdups\therald CPU %\tacks\t")
		for _, l := range r.Latency {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d/%d\t%d\t%.0f\t%s\t\n",
				l.Transport, l.P50, l.P90, l.P99, l.P999, l.Max, l.Received, l.Pushed, l.Duplicates, l.ServerCPU, l.Ack)
		}
		_ = tw.Flush()
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintln(w, "\nend-to-end throughput (push over HTTP, WebSocket delivery, batched acks)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "phase\tbatch\tpartitions\tpushed/s\tdelivered/s\tacked/s\tbacklog\t")
		for _, t := range r.Throughput {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%d\t\n", t.Phase, t.Batch, t.Partitions,
				t.PushedPerSec, t.DeliveredPerS, t.AckedPerSec, t.Backlog)
		}
		_ = tw.Flush()
	}
	if i := r.Idle; i != nil {
		fmt.Fprintln(w, "\nidle connections")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "ws\tsse\tconnects/s\tRSS before MiB\tafter connect MiB\tsettled MiB\tKB/conn\tidle CPU %\tqueries/s\t")
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t\n", i.WS, i.SSE, i.ConnectPerSec,
			float64(i.RSSBefore)/(1<<20), float64(i.RSSAfter)/(1<<20), float64(i.RSSSettled)/(1<<20),
			i.BytesPerConn/1024, i.CPUPercent, i.QueriesPerSec)
		fmt.Fprintln(w, "KB/conn = (settled RSS − RSS before) / connections; settled = at the end of the idle window")
		_ = tw.Flush()
		if i.FileLimitNote != "" {
			fmt.Fprintln(w, "note:", i.FileLimitNote)
		}
	}
}
