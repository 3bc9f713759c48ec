package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
)

// The metrics flags: the label bound, group labels and /metrics auth, from
// flags (a switch alone turns it on) and the environment.
func TestFlags_Metrics(t *testing.T) {
	var out bytes.Buffer
	c, err := parseConfig("serve", nil, func(string) string { return "" }, &out)
	require.NoError(t, err)
	assert.Equal(t, gateway.MetricsMaxQueuesDefault, c.MetricsMaxQueues)
	assert.False(t, c.MetricsGroupLabels)
	assert.False(t, c.MetricsAuth)

	env := map[string]string{"HERALD_METRICS_MAX_QUEUES": "7", "HERALD_METRICS_GROUP_LABELS": "true",
		"HERALD_AUTH_SECRET": strings.Repeat("s", 32)}
	c, err = parseConfig("serve", []string{"--metrics-auth", "--metrics-max-queues", "0"},
		func(k string) string { return env[k] }, &out)
	require.NoError(t, err)
	assert.Equal(t, 0, c.MetricsMaxQueues, "flag over env")
	assert.True(t, c.MetricsGroupLabels)
	assert.True(t, c.MetricsAuth)
	c, err = parseConfig("serve", []string{"--metrics-group-labels=false"}, func(k string) string { return env[k] }, &out)
	require.NoError(t, err)
	assert.False(t, c.MetricsGroupLabels)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--metrics-max-queues", "-1"}, "--metrics-max-queues"},
		{[]string{"--metrics-auth"}, "--metrics-auth needs auth on"},
		{[]string{"--metrics-group-labels=maybe"}, "invalid"},
	} {
		out.Reset()
		_, err := parseConfig("serve", tc.args, func(string) string { return "" }, &out)
		require.Error(t, err, "%v", tc.args)
		assert.Contains(t, err.Error()+out.String(), tc.want)
	}
}

// The flags reach the server: with --metrics-auth /metrics takes an admin
// token, and --metrics-max-queues 1 names one queue.
func TestServe_MetricsFlags(t *testing.T) {
	bin := buildHerald(t)
	secret := strings.Repeat("k", 32)
	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-secret", secret,
		"--metrics-auth", "--metrics-max-queues", "1")
	admin := auth.SignToken([]byte(secret), "ops", "admin", time.Hour)
	call := func(method, path, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, p.url+path, strings.NewReader(body))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, q := range []string{"first", "second", "third"} {
		code, body := call(http.MethodPost, "api/v1/push", admin, `{"items":[{"queue":"`+q+`","payload":1}]}`)
		require.Equal(t, http.StatusCreated, code, body)
	}
	code, _ := call(http.MethodGet, "metrics", "", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = call(http.MethodGet, "health", "", "")
	assert.Equal(t, http.StatusOK, code)
	code, body := call(http.MethodGet, "metrics", admin, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `herald_messages_pushed_total{queue="first"} 1`)
	assert.Contains(t, body, `herald_messages_pushed_total{queue="__other__"} 2`)
	assert.NotContains(t, body, `queue="second"`)
}
