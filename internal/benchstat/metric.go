package benchstat

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Metric sums a Prometheus counter or gauge over all its label sets, as
// base + "/metrics" answers it (a server under measure: the benchmarks
// read its gauges and counters at the start and end of a run). A metric
// whose name only begins with name is not counted; one absent sums to 0.
func Metric(hc *http.Client, base, name string) (float64, error) {
	res, err := hc.Get(base + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("reading metrics: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	sum := 0.0
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name)
		if !ok || rest == "" || rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	if err := sc.Err(); err != nil {
		return sum, fmt.Errorf("reading metrics: %w", err)
	}
	return sum, nil
}

// MetricByLabel reads a Prometheus series of one label (name{label="v"})
// from base + "/metrics": its value per label value.
func MetricByLabel(hc *http.Client, base, name, label string) (map[string]float64, error) {
	res, err := hc.Get(base + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	out := map[string]float64{}
	prefix := name + "{" + label + `="`
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		v, rest, ok := strings.Cut(rest, `"`)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if n, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			out[v] += n
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading metrics: %w", err)
	}
	return out, nil
}
