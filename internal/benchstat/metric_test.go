package benchstat

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A metric's figure is the sum of its samples over every label set; a
// metric whose name only begins with it, comments and other metrics are
// not counted.
func TestMetric_SumsEveryLabelSetOfTheNamedMetricOnly(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/metrics", r.URL.Path)
		_, _ = w.Write([]byte(`# HELP herald_followers Followers.
# TYPE herald_followers gauge
herald_followers{queue="a"} 2
herald_followers{queue="b b"} 3.5
herald_followers 1
herald_followers_max 100
herald_other 7
`))
	}))
	defer ts.Close()
	v, err := Metric(ts.Client(), ts.URL, "herald_followers")
	require.NoError(t, err)
	assert.InDelta(t, 6.5, v, 1e-9)
	v, err = Metric(ts.Client(), ts.URL, "herald_absent")
	require.NoError(t, err)
	assert.Zero(t, v)

	ts.Close()
	_, err = Metric(ts.Client(), ts.URL, "herald_followers")
	assert.ErrorContains(t, err, "reading metrics")
}
