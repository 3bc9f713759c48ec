package main

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
)

// html renders the report as one self-contained page: tables and bar
// charts drawn as inline SVG, nothing fetched to view it.
func (r *report) html() []byte {
	var b bytes.Buffer
	_ = reportPage.Execute(&b, r)
	return b.Bytes()
}

type bar struct {
	Label      string
	Value, Max float64
	Unit       string
}

// bars draws a horizontal bar chart.
func bars(title string, rows []bar) template.HTML {
	const width, rowH, labelW = 760, 22, 300
	top := 0.0
	for _, r := range rows {
		top = math.Max(top, r.Value)
	}
	if top == 0 {
		top = 1
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<figure><figcaption>%s</figcaption><svg role="img" aria-label="%s" width="%d" height="%d" viewBox="0 0 %d %d">`,
		template.HTMLEscapeString(title), template.HTMLEscapeString(title), width, rowH*len(rows)+4, width, rowH*len(rows)+4)
	for i, r := range rows {
		y := i*rowH + 2
		w := (width - labelW - 90) * r.Value / top
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" font-size="12">%s</text>`, labelW-6, y+15, template.HTMLEscapeString(r.Label))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="#2d5bd7"/>`, labelW, y+3, math.Max(w, 1), rowH-6)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="12">%.2f %s</text>`, float64(labelW)+w+6, y+15, r.Value, r.Unit)
	}
	b.WriteString(`</svg></figure>`)
	return template.HTML(b.String()) // #nosec G203 -- built above from escaped strings and numbers
}

func latencyBars(title string, rows []latencyResult, pick func(latencyResult) float64) template.HTML {
	var bs []bar
	for _, l := range rows {
		bs = append(bs, bar{Label: l.Setup + " · " + l.Wake + " · " + l.Transport, Value: pick(l), Unit: "ms"})
	}
	return bars(title, bs)
}

var reportPage = template.Must(template.New("report").Funcs(template.FuncMap{
	"p50": func(title string, rows []latencyResult) template.HTML {
		return latencyBars(title, rows, func(l latencyResult) float64 { return l.P50 })
	},
	"p99": func(title string, rows []latencyResult) template.HTML {
		return latencyBars(title, rows, func(l latencyResult) float64 { return l.P99 })
	},
	"tput":  throughputBars,
	"ramp":  rampBars,
	"mib":   func(v int64) string { return fmt.Sprintf("%.1f", float64(v)/(1<<20)) },
	"cpu1k": cpuPer1k,
	"kb":    func(v float64) string { return fmt.Sprintf("%.1f", v/1024) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>herald-bench report</title>
<style>
body{font-family:system-ui,sans-serif;margin:2rem;color:#1d2330;max-width:1100px}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0 1.5rem}
th,td{border-bottom:1px solid #dde1e8;padding:.3rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}
figure{margin:1rem 0}figcaption{font-weight:600;margin-bottom:.3rem}
.muted{color:#5d6678}
</style></head><body>
<h1>herald-bench</h1>
<p class="muted">{{.Machine}} · started {{.Started.Format "2006-01-02 15:04:05 MST"}} · rate {{.Settings.Rate}} msgs/s for {{.Settings.Duration}} · wake {{.Settings.Wake}}</p>
{{if .Latency}}<h2>Push → receipt latency</h2>
{{p50 "p50 (ms)" .Latency}}{{p99 "p99 (ms)" .Latency}}
<table><tr><th>setup · wake · transport</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>received</th><th>dups</th><th>herald CPU %</th><th>CPU s/1k (herald+PG)</th><th>machine busy %</th><th>of it others' %</th></tr>
{{range .Latency}}<tr><td>{{.Setup}} · {{.Wake}} · {{.Transport}}</td><td>{{printf "%.2f" .P50}}</td><td>{{printf "%.2f" .P90}}</td><td>{{printf "%.2f" .P99}}</td><td>{{printf "%.2f" .P999}}</td><td>{{printf "%.2f" .Max}}</td><td>{{.Received}}/{{.Pushed}}</td><td>{{.Duplicates}}</td><td>{{printf "%.0f" .ServerCPU}}</td><td>{{cpu1k .CPUPer1k}}</td><td>{{printf "%.0f" .MachineBusy}}</td><td>{{printf "%.0f" .OthersBusy}}</td></tr>
{{end}}</table>{{end}}
{{if .Cluster}}<h2>Cross-instance latency (push through instance 1)</h2>
{{p50 "p50 (ms)" .Cluster}}{{p99 "p99 (ms)" .Cluster}}
<table><tr><th>setup · transport</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>received</th><th>dups</th><th>machine busy %</th><th>of it others' %</th></tr>
{{range .Cluster}}<tr><td>{{.Setup}} · {{.Transport}}</td><td>{{printf "%.2f" .P50}}</td><td>{{printf "%.2f" .P90}}</td><td>{{printf "%.2f" .P99}}</td><td>{{printf "%.2f" .P999}}</td><td>{{printf "%.2f" .Max}}</td><td>{{.Received}}/{{.Pushed}}</td><td>{{.Duplicates}}</td><td>{{printf "%.0f" .MachineBusy}}</td><td>{{printf "%.0f" .OthersBusy}}</td></tr>
{{end}}</table>{{end}}
{{if .Throughput}}<h2>Throughput</h2>{{tput .Throughput}}
<table><tr><th>phase</th><th>batch</th><th>partitions</th><th>groups</th><th>pushed/s</th><th>delivered/s per group</th><th>acked/s per group</th><th>backlog</th></tr>
{{range .Throughput}}<tr><td>{{.Phase}}</td><td>{{.Batch}}</td><td>{{.Partitions}}</td><td>{{.Groups}}</td><td>{{printf "%.0f" .PushedPerSec}}</td><td>{{printf "%.0f" .DeliveredPerS}}</td><td>{{printf "%.0f" .AckedPerSec}}</td><td>{{.Backlog}}</td></tr>
{{end}}</table>{{end}}
{{if .Connections}}<h2>Connection ramp</h2>{{ramp .Connections}}
<table><tr><th>connections</th><th>connects/s</th><th>RSS MiB</th><th>KB/conn</th></tr>
{{range .Connections}}<tr><td>{{.Connections}}</td><td>{{printf "%.0f" .ConnectPerSec}}</td><td>{{mib .RSS}}</td><td>{{kb .BytesPerConn}}</td></tr>
{{end}}</table>{{end}}
{{with .Idle}}<h2>Idle connections</h2>
<table><tr><th>ws</th><th>sse</th><th>long-poll</th><th>connects/s</th><th>RSS before MiB</th><th>settled MiB</th><th>KB/conn</th><th>idle CPU %</th><th>queries/s</th></tr>
<tr><td>{{.WS}}</td><td>{{.SSE}}</td><td>{{.LongPoll}}</td><td>{{printf "%.0f" .ConnectPerSec}}</td><td>{{mib .RSSBefore}}</td><td>{{mib .RSSSettled}}</td><td>{{kb .BytesPerConn}}</td><td>{{printf "%.2f" .CPUPercent}}</td><td>{{printf "%.2f" .QueriesPerSec}}</td></tr></table>{{end}}
</body></html>
`))

func throughputBars(rows []throughputResult) template.HTML {
	var bs []bar
	for _, t := range rows {
		v := t.PushedPerSec
		if t.Phase != "push" {
			v = t.DeliveredPerS
		}
		bs = append(bs, bar{Label: fmt.Sprintf("%s, batch %d, %d partitions, %d groups", t.Phase, t.Batch, t.Partitions, max(t.Groups, 1)),
			Value: v, Unit: "msgs/s"})
	}
	return bars("messages per second (pushed for push, delivered otherwise)", bs)
}

func rampBars(rows []connectionsResult) template.HTML {
	var bs []bar
	for _, c := range rows {
		bs = append(bs, bar{Label: fmt.Sprintf("%d connections", c.Connections), Value: c.BytesPerConn / 1024, Unit: "KB/conn"})
	}
	return bars("RSS per connection as the connections grow", bs)
}
