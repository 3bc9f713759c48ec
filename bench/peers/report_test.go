package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldmq/herald/internal/fanoutload"
)

// fakeSystem names a system in a report; it measures nothing.
type fakeSystem struct {
	n         string
	maxGroups int
}

func (f fakeSystem) name() string { return f.n }
func (f fakeSystem) run(context.Context, int, time.Duration, time.Duration) (sample, error) {
	return sample{}, nil
}
func (f fakeSystem) close() {}
func (f fakeSystem) e2e(context.Context, int, time.Duration, time.Duration) (e2eSample, error) {
	return e2eSample{}, nil
}
func (f fakeSystem) e2eMaxGroups() int { return f.maxGroups }

// tableAfter is the markdown table that follows the line starting with
// title in text: its heading, rule and rows.
func tableAfter(t *testing.T, text, title string) []string {
	t.Helper()
	_, rest, ok := strings.Cut("\n"+text, "\n"+title)
	if !ok {
		t.Fatalf("no %q in\n%s", title, text)
	}
	var rows []string
	for _, l := range strings.Split(rest, "\n")[1:] {
		if strings.HasPrefix(l, "|") {
			rows = append(rows, l)
		} else if len(rows) > 0 {
			break
		}
	}
	return rows
}

func sameRows(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("table:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestReportLatency_TablesShowMediansAndRatiosToHerald(t *testing.T) {
	cfg := config{rounds: 3, rates: []int{100}, systems: []string{"herald", "nats"}}
	sys := []system{fakeSystem{n: "herald"}, fakeSystem{n: "nats"}}
	res := map[string]map[int][]sample{
		"herald": {100: {{P50: 1, P99: 4, cpuCost: cpuCost{CPUPer1k: 0.2, ServerCPU: 0.1}}, {P50: 2, P99: 5, cpuCost: cpuCost{CPUPer1k: 0.3, ServerCPU: 0.1}},
			{P50: 9, P99: 9, cpuCost: cpuCost{CPUPer1k: 0.9, ServerCPU: 0.1}}}},
		"nats": {100: {{P50: 3, P99: 15, cpuCost: cpuCost{CPUPer1k: 0.6, ServerCPU: 0.6}}}},
	}
	var b strings.Builder
	reportLatency(&b, cfg, sys, res)
	sameRows(t, tableAfter(t, b.String(), "Latency."), []string{
		"| system | 100 msgs/s: p50 / p99 ms | 100 msgs/s: CPU s per 1,000 (server + PG) |",
		"|---|---|---|",
		"| " + describe["herald"] + " | 2.00 / 5.00 | 0.300 (0.100 + 0.200) |",
		"| " + describe["nats"] + " | 3.00 / 15.00 | 0.600 |",
	})
	sameRows(t, tableAfter(t, b.String(), "Ratio to Herald"), []string{
		"| system | 100/s p50 | 100/s p99 | 100/s CPU |",
		"|---|---|---|---|",
		"| nats | 1.50× | 3.00× | 2.00× |",
	})
}

func TestReportE2E_RatioTableSkipsWhatASystemCannotRun(t *testing.T) {
	cfg := config{rounds: 1, e2eGroups: []int{1, 5}, systems: []string{"herald", "river"}}
	sys := []system{fakeSystem{n: "herald", maxGroups: 5}, fakeSystem{n: "river", maxGroups: 1}}
	res := map[string]map[int][]e2eSample{
		"herald": {1: {{Delivered: 1000, cpuCost: cpuCost{CPUPer1k: 0.5}}}, 5: {{Delivered: 4000, cpuCost: cpuCost{CPUPer1k: 0.4}}}},
		"river":  {1: {{Delivered: 500, cpuCost: cpuCost{CPUPer1k: 1.5}}}},
	}
	var b strings.Builder
	reportE2E(&b, cfg, sys, res)
	sameRows(t, tableAfter(t, b.String(), "Ratio to Herald"), []string{
		"| system | 1 group: delivered/s | 1 group: CPU | 5 groups: delivered/s | 5 groups: CPU |",
		"|---|---|---|---|---|",
		"| river | 0.50× | 3.00× | — | — |",
	})
}

// TestReportLatency_SettingsSayHowManyPartitions: the latency settings
// name the partitions the pushes went to (--partitions), one or many.
func TestReportLatency_SettingsSayHowManyPartitions(t *testing.T) {
	for n, want := range map[int]string{1: "over 1 partition;", 16: "over 16 partitions, round robin;"} {
		cfg := config{rounds: 1, rates: []int{100}, systems: []string{"herald"}, partitions: n}
		var b strings.Builder
		reportLatency(&b, cfg, []system{fakeSystem{n: "herald"}}, map[string]map[int][]sample{})
		if !strings.Contains(b.String(), want) {
			t.Errorf("--partitions %d: the settings do not say %q:\n%s", n, want, b.String())
		}
	}
}

// TestRun_RefusesPartitionsOutOfRange: --partitions is 1 to maxPartitions;
// anything else is refused before anything starts.
func TestRun_RefusesPartitionsOutOfRange(t *testing.T) {
	for _, v := range []string{"0", "-1", fmt.Sprint(maxPartitions + 1)} {
		err := run([]string{"--scenario", "latency", "--partitions", v}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--partitions") {
			t.Errorf("--partitions %s: %v, want an error naming --partitions", v, err)
		}
	}
}

// fakeFanouter is a fakeSystem the fanout scenario would measure.
type fakeFanouter struct{ fakeSystem }

func (fakeFanouter) fanout(int) fanoutTarget { return fanoutTarget{} }

// TestReportFanout_CPUShowsPostgreSQLsPartAndTheRatioToHerald: the fanout
// table's CPU cell is the median at four decimals, split into the
// server's and PostgreSQL's parts where the latter shows at that
// precision, and the ratio column divides it by Herald's.
func TestReportFanout_CPUShowsPostgreSQLsPartAndTheRatioToHerald(t *testing.T) {
	c := fanoutload.Case{Followers: 10, Rate: 5}
	cfg := config{rounds: 1, fanoutCases: []fanoutload.Case{c}}
	sys := []system{fakeFanouter{fakeSystem{n: "herald"}}, fakeFanouter{fakeSystem{n: "floor"}}}
	counts := fanoutload.Counts{Followers: 10, Expected: 100, Received: 100}
	res := map[string]map[fanoutload.Case][]fanoutSample{
		"herald": {c: {{counts: counts, p50: 1, p99: 2, cpuCost: cpuCost{CPUPer1k: 0.02, ServerCPU: 0.015}, cliPer1k: 0.5}}},
		"floor":  {c: {{counts: counts, p50: 0.5, p99: 1, cpuCost: cpuCost{CPUPer1k: 0.01, ServerCPU: 0.01}, cliPer1k: 0.25}}},
	}
	var b strings.Builder
	reportFanout(&b, cfg, sys, res)
	rows := tableAfter(t, b.String(), "Fanout.")
	sameRows(t, rows[2:], []string{
		"| herald | 10@5 | 100/100 | 0 | 0 | 1.0 / 2.0 | 0.0200 (0.0150 + 0.0050) | 1.00× | 0.5000 |",
		"| floor | 10@5 | 100/100 | 0 | 0 | 0.5 / 1.0 | 0.0100 | 0.50× | 0.2500 |",
	})
}
