package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfig_Precedence(t *testing.T) {
	env := map[string]string{"HERALD_ADDR": ":7000", "HERALD_LOG_LEVEL": "debug", "HERALD_SHUTDOWN_TIMEOUT": "3s"}
	var out bytes.Buffer
	c, err := parseConfig("serve", []string{"--log-level", "warn"}, func(k string) string { return env[k] }, &out)
	require.NoError(t, err)
	assert.Equal(t, ":7000", c.Addr, "env over default")
	assert.Equal(t, "warn", c.LogLevel, "flag over env")
	assert.Equal(t, 3*time.Second, c.ShutdownTimeout)
	assert.Equal(t, "./.herald", c.DataDir, "default")
	assert.Equal(t, int64(8<<20), c.BodyLimit)
}

func TestParseConfig_Invalid(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--log-level", "loud"}, want: "--log-level"},
		{args: []string{"--body-limit", "-1"}, want: "--body-limit"},
		{args: []string{"--body-limit", "lots"}, want: "invalid value"},
		{env: map[string]string{"HERALD_DB_MAX_CONNS": "many"}, want: "HERALD_DB_MAX_CONNS"},
		// Retention and hygiene hold one connection while they work on
		// another: with one, they never run.
		{args: []string{"--db-max-conns", "1"}, want: "--db-max-conns"},
		{args: []string{"--db-max-conns", "5000000000"}, want: "--db-max-conns"},
		// Days past a century would overflow the cleanup age (213,504 days
		// wrapped to 25 minutes).
		{args: []string{"--partition-cleanup-days", "213504"}, want: "--partition-cleanup-days"},
		{args: []string{"--pg-port", "70000"}, want: "--pg-port"},
		{args: []string{"extra"}, want: "unexpected argument"},
		{args: []string{"--no-such-flag"}, want: "not defined"},
		{args: []string{"--ws-allowed-origins", "https://app.example,*"}, want: "--ws-allowed-origins"},
		{args: []string{"--ws-allowed-origins", "app.example"}, want: "--ws-allowed-origins"},
	} {
		var out bytes.Buffer
		_, err := parseConfig("serve", tc.args, func(k string) string { return tc.env[k] }, &out)
		require.Error(t, err, "%v %v", tc.args, tc.env)
		assert.Contains(t, err.Error()+out.String(), tc.want)
	}
}

func TestRun_VersionAndHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, 0, run([]string{"version"}, &out, &errOut))
	assert.True(t, strings.HasPrefix(out.String(), "herald "))
	out.Reset()
	assert.Equal(t, 0, run([]string{"--help"}, &out, &errOut))
	for _, o := range options {
		assert.Contains(t, errOut.String(), "--"+o.flag)
		assert.Contains(t, errOut.String(), o.env)
	}
	assert.Equal(t, 2, run([]string{"--log-level", "loud"}, &out, &errOut))
}

// The configuration table of docs/operating.md is generated from the same
// option table as --help; this fails when one changes without the other.
func TestOperatingDoc_ConfigTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	assert.Contains(t, string(doc), markdownTable(),
		"docs/operating.md's configuration table is stale; replace it with:\n%s", markdownTable())
}
