package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/heraldmq/herald/internal/server/servertest"
)

// The monitoring files in the repository, read by operators' Grafana and
// Prometheus.
const (
	dashboardPath = "../deploy/grafana/herald.json"
	alertsPath    = "../deploy/prometheus/alerts.yml"
)

// synthetic are the series Prometheus makes itself, never in /metrics.
var synthetic = []string{"up"}

// Every metric the Grafana dashboard and the alert rules use
// exists in a real instance's /metrics, after the traffic that makes
// labelled series appear; a family with no series yet (no auth failure,
// no syncnet peer) must at least be registered. And both files are well
// formed: rule groups whose alerts each have a for, a severity and a
// summary; panels each with the templated datasource and a query.
func TestMonitoring_DashboardAndAlertsUseRealMetrics(t *testing.T) {
	exprs := append(dashboardExprs(t), alertExprs(t)...)
	require.NotEmpty(t, exprs)

	e, in := newInstance(t, servertest.SharedDSN(t), "syncnet")
	// Traffic: pushes (one a duplicate), a WebSocket subscription served
	// by the poller (delivery latency), pops, acks completed and dlq (the
	// dead-letter counter and gauge), a message left unfinished (lag and
	// its age), then a hygiene sample.
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","id":1,"queue":"mon-ws","batch":5}`)
	e.push("mon-ws", `{"n":1}`)
	c.send(ackFrame(deliveredMessages(t, c.next("deliver")), "completed"))
	c.next("ack_result")
	e.pushItems(`[{"queue":"mon","payload":1,"transactionId":"t1"},{"queue":"mon","payload":2,"transactionId":"t2"},` +
		`{"queue":"mon","payload":3,"transactionId":"t3"}]`)
	e.pushItems(`[{"queue":"mon","payload":1,"transactionId":"t1"}]`)
	popped := e.pop("/api/v1/pop/queue/mon?wait=false&batch=2")
	require.Len(t, popped.Messages, 2)
	assert.True(t, e.ack(popped.Messages[0], "completed", "").Success)
	assert.True(t, e.ack(popped.Messages[1], "dlq", "poison").DLQ)
	require.NoError(t, in.SampleHygiene(ctxT(t)))

	families := scrapeFamilies(t, in.URL()+"/metrics")
	var byDescriptor []string
	for _, name := range metricNames(exprs) {
		if exposed(families, name) {
			continue
		}
		if registered(in.Registry(), name) {
			byDescriptor = append(byDescriptor, name)
			continue
		}
		if slices.Contains(synthetic, name) {
			continue
		}
		t.Errorf("%s is used by the dashboard or the alerts but is not in /metrics", name)
	}
	t.Logf("%d metric names used; registered with no series in this run: %v", len(metricNames(exprs)), byDescriptor)
	labels := familyLabels(t, in.Registry())
	for _, expr := range exprs {
		for _, bad := range unknownLabels(expr, labels) {
			t.Errorf("%s: %s", bad, expr)
		}
	}
	for _, name := range []string{"herald_consumer_lag_messages", "herald_oldest_pending_age_seconds", "herald_dead_letters",
		"herald_delivery_latency_seconds", "herald_messages_dead_lettered_total", "herald_messages_duplicate_total"} {
		assert.Contains(t, families, name, "the traffic makes %s appear", name)
	}
}

// The checker finds what a typo would hide: names in every position of a
// PromQL expression, and none of its functions, keywords, labels or
// Grafana variables.
func TestMonitoring_MetricNamesChecker(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (queue, status) (rate(herald_acks_total{instance=~"$instance",queue=~"$queue"}[$__rate_interval]))`,
			[]string{"herald_acks_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(herald_x_seconds_bucket[5m]))) > 0.1`, []string{"herald_x_seconds_bucket"}},
		{`herald_a / herald_b > 0.9`, []string{"herald_a", "herald_b"}},
		{`max by (q) (delta(herald_lag[30m])) > 0 and max by (q) (herald_lag) > 1e3`, []string{"herald_lag"}},
		{`up{job="herald"} == 0`, []string{"up"}},
		{`sum without (instance) (herald_c offset 5m) unless on (queue) group_left herald_d`, []string{"herald_c", "herald_d"}},
		{`label_values(herald_http_requests_total, instance)`, []string{"herald_http_requests_total"}},
		{`label_values(herald_p{queue=~"$queue"}, group)`, []string{"herald_p"}},
		{`max(herald_slot_bytes) > 5e9`, []string{"herald_slot_bytes"}},
	} {
		assert.Equal(t, tc.want, metricNames([]string{tc.expr}), tc.expr)
	}
	fams := map[string]string{"herald_acks_total": "counter", "herald_x_seconds": "histogram"}
	assert.True(t, exposed(fams, "herald_x_seconds_bucket"))
	assert.False(t, exposed(fams, "herald_acks_totl"), "a misspelling is caught")
	assert.False(t, exposed(fams, "herald_acks_total_bucket"), "only a histogram has buckets")
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_v_total", Help: "v"}, []string{"l"}))
	assert.True(t, registered(reg, "herald_v_total"), "registered, no series yet")
	assert.False(t, registered(reg, "herald_w_total"))
	assert.False(t, registered(reg, "herald_w_total"), "the probe leaves nothing registered")
	assert.NoError(t, reg.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "herald_w_total", Help: "w"})),
		"the probe leaves nothing registered")
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	Targets    []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// templated is the datasource every panel and variable names: the
// DS_PROMETHEUS variable, chosen at import.
const templated = "${DS_PROMETHEUS}"

// dashboardExprs checks the dashboard's shape and returns its queries
// (panel targets and variable queries).
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(raw))
	require.NoError(t, dec.Decode(&d), "the dashboard is JSON")
	assert.GreaterOrEqual(t, d.SchemaVersion, 39)
	var exprs []string
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type != "query" {
			continue
		}
		require.NotNil(t, v.Datasource, "variable %s", v.Name)
		assert.Equal(t, templated, v.Datasource.UID, "variable %s", v.Name)
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil || q.Query == "" {
			require.NoError(t, json.Unmarshal(v.Query, &q.Query), "variable %s: query", v.Name)
		}
		exprs = append(exprs, q.Query)
	}
	assert.Equal(t, map[string]string{"DS_PROMETHEUS": "datasource", "instance": "query", "queue": "query", "group": "query"}, vars)
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d not unique (also %q)", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if assert.NotNil(t, p.Datasource, "panel %q: datasource", p.Title) {
				assert.Equal(t, templated, p.Datasource.UID, "panel %q", p.Title)
			}
			if assert.NotEmpty(t, p.Targets, "panel %q: a query", p.Title) {
				for _, tg := range p.Targets {
					assert.NotEmpty(t, tg.Expr, "panel %q, target %s", p.Title, tg.RefID)
					exprs = append(exprs, tg.Expr)
				}
			}
		}
	}
	walk(d.Panels)
	assert.Greater(t, len(ids), 20, "panels")
	return exprs
}

// ruleFile is a Prometheus rule file; decoding it with KnownFields fails
// on a field Prometheus would not know either.
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// alertExprs checks the rule file's shape and returns its expressions.
func alertExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(alertsPath)
	require.NoError(t, err)
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&f), "the rules are Prometheus rule groups")
	require.NotEmpty(t, f.Groups)
	var exprs []string
	alerts, groups := map[string]bool{}, map[string]bool{}
	for _, g := range f.Groups {
		assert.NotEmpty(t, g.Name)
		assert.False(t, groups[g.Name], "group %s twice", g.Name)
		groups[g.Name] = true
		require.NotEmpty(t, g.Rules, "group %s", g.Name)
		for _, r := range g.Rules {
			if !assert.NotEmpty(t, r.Alert, "group %s: only alerts (%s)", g.Name, r.Record) {
				continue
			}
			assert.False(t, alerts[r.Alert], "alert %s twice", r.Alert)
			alerts[r.Alert] = true
			_, err := time.ParseDuration(r.For)
			assert.NoError(t, err, "alert %s: for", r.Alert)
			assert.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], "alert %s: severity", r.Alert)
			assert.NotEmpty(t, r.Annotations["summary"], "alert %s: summary", r.Alert)
			assert.NotEmpty(t, r.Annotations["description"], "alert %s: description", r.Alert)
			assert.NoError(t, balanced(r.Expr), "alert %s: %s", r.Alert, r.Expr)
			exprs = append(exprs, r.Expr)
		}
	}
	for _, want := range []string{"HeraldInstanceDown", "HeraldConsumerLagHigh", "HeraldConsumerLagGrowing",
		"HeraldOldestPendingOld", "HeraldDeadLettersGrowing", "HeraldXminHeld", "HeraldReplicationSlotRetainingWAL",
		"HeraldSyncnetPeerDead", "HeraldDBPoolSaturated"} {
		assert.True(t, alerts[want], "alert %s", want)
	}
	return exprs
}

// balanced is a cheap syntax check: brackets nest and close.
func balanced(expr string) error {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range stripStrings(expr) {
		switch r {
		case '(', '[', '{':
			stack = append(stack, r)
		case ')', ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return fmt.Errorf("unbalanced %q", r)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 {
		return errors.New("unclosed bracket")
	}
	return nil
}

var (
	promqlString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	// Label matchers, ranges and subqueries, and the label lists of by,
	// without, on, ignoring, group_left and group_right.
	braces    = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	labelList = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	// label_values(metric, label): the second argument is a label.
	labelValues = regexp.MustCompile(`\blabel_values\s*\(\s*([A-Za-z_:][A-Za-z0-9_:]*)[^()]*\)`)
	// An identifier not inside a number (1e3) or a longer name.
	ident = regexp.MustCompile(`(^|[^A-Za-z0-9_:.$])([A-Za-z_:][A-Za-z0-9_:]*)`)
)

var promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true,
	"ignoring": true, "group_left": true, "group_right": true, "offset": true, "bool": true, "inf": true, "nan": true,
	"atan2": true}

func stripStrings(expr string) string { return promqlString.ReplaceAllString(expr, `""`) }

// metricNames are the metric names an expression list reads, sorted and
// unique: identifiers left once strings, label matchers, ranges and label
// lists are gone, except those called as functions (aggregations too) and
// PromQL's keywords.
func metricNames(exprs []string) []string {
	var out []string
	for _, expr := range exprs {
		s := stripStrings(expr)
		s = labelValues.ReplaceAllString(s, " $1 ")
		for prev := ""; prev != s; {
			prev, s = s, braces.ReplaceAllString(s, " ")
		}
		s = labelList.ReplaceAllString(s, " ")
		for _, m := range ident.FindAllStringSubmatchIndex(s, -1) {
			name := s[m[4]:m[5]]
			rest := strings.TrimLeft(s[m[5]:], " \t\n")
			if strings.HasPrefix(rest, "(") || promqlKeywords[strings.ToLower(name)] {
				continue
			}
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// scrapeFamilies GETs a Prometheus text exposition and returns its
// families' names and types.
func scrapeFamilies(t *testing.T, url string) map[string]string {
	t.Helper()
	res, err := http.Get(url) // #nosec G107 -- the test server's URL
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	require.Equal(t, http.StatusOK, res.StatusCode)
	out := map[string]string{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = f[3]
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, out)
	return out
}

// exposed says whether name is a family of the scrape, or a histogram's
// (or summary's) _bucket, _sum or _count series.
func exposed(families map[string]string, name string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch families[base] {
		case "histogram":
			return true
		case "summary":
			return suffix != "_bucket"
		}
	}
	return false
}

// registered says whether reg holds a collector describing name (a
// family with no series yet: a vector nothing has labelled). A registry
// lists no descriptors, so it is offered a probe: a collector describing
// name (with a help text of its own) and then an invalid descriptor. The
// registry refuses the first if a registered descriptor has its name, and
// else the second, registering nothing either way.
func registered(reg *prometheus.Registry, name string) bool {
	for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		err := reg.Register(probe{prometheus.NewDesc(base, "monitoring probe", nil, nil)})
		if err != nil && strings.Contains(err.Error(), "previously registered descriptor with the same fully-qualified name") {
			return true
		}
	}
	return false
}

var errProbe = errors.New("monitoring probe: never registered")

// probe describes its descriptor, then one the registry rejects.
type probe struct{ desc *prometheus.Desc }

func (p probe) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.desc
	ch <- prometheus.NewInvalidDesc(errProbe)
}

func (p probe) Collect(chan<- prometheus.Metric) {}

// familyLabels are the label names each gathered family's series carry
// (a family with no series yet is absent: its labels are unknown).
func familyLabels(t *testing.T, reg *prometheus.Registry) map[string]map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if out[mf.GetName()] == nil {
				out[mf.GetName()] = map[string]bool{}
			}
			for _, lp := range m.GetLabel() {
				out[mf.GetName()][lp.GetName()] = true
			}
		}
		if mf.GetType().String() == "HISTOGRAM" && out[mf.GetName()] != nil {
			out[mf.GetName()]["le"] = true
		}
	}
	return out
}

var (
	selector = regexp.MustCompile(`([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^{}]*)\}`)
	matcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	listed   = regexp.MustCompile(`\b(?:by|without)\s*\(([^()]*)\)`)
)

// scrapeLabels are added by Prometheus to every series it scrapes.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// unknownLabels are the label names expr matches on a metric, or groups
// by, that the metric's series (any of the expression's metrics, for a
// grouping) do not carry: a misspelt label selects nothing, silently.
// Metrics whose labels are unknown (no series in this run) are skipped.
func unknownLabels(expr string, labels map[string]map[string]bool) []string {
	s := stripStrings(expr)
	family := func(name string) map[string]bool {
		if l, ok := labels[name]; ok {
			return l
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok {
				return labels[base]
			}
		}
		return nil
	}
	var out []string
	var known []map[string]bool
	for _, m := range selector.FindAllStringSubmatch(s, -1) {
		l := family(m[1])
		if l == nil {
			continue
		}
		known = append(known, l)
		for _, mm := range matcher.FindAllStringSubmatch(m[2], -1) {
			if name := mm[1]; name != "__name__" && !l[name] && !scrapeLabels[name] {
				out = append(out, fmt.Sprintf("%s has no label %q", m[1], name))
			}
		}
	}
	for _, name := range metricNames([]string{expr}) {
		if l := family(name); l != nil {
			known = append(known, l)
		}
	}
	if len(known) == 0 {
		return out
	}
	for _, m := range listed.FindAllStringSubmatch(s, -1) {
		for _, name := range strings.Split(m[1], ",") {
			name = strings.TrimSpace(name)
			if name == "" || scrapeLabels[name] {
				continue
			}
			if !slices.ContainsFunc(known, func(l map[string]bool) bool { return l[name] }) {
				out = append(out, fmt.Sprintf("no metric of the expression has label %q to group by", name))
			}
		}
	}
	return out
}
