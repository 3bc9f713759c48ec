package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --trace-retention (HERALD_TRACE_RETENTION), 7 days by default;
// 0 keeps traces forever (internal/server's TestStoreDurations), a
// negative value is refused.
func TestTraceRetentionFlag(t *testing.T) {
	parse := func(args []string, env map[string]string) (*config, error) {
		var out bytes.Buffer
		return parseConfig("serve", args, func(k string) string { return env[k] }, &out)
	}
	c, err := parse(nil, nil)
	require.NoError(t, err)
	assert.Equal(t, 7*24*time.Hour, c.TraceRetention)

	c, err = parse(nil, map[string]string{"HERALD_TRACE_RETENTION": "36h"})
	require.NoError(t, err)
	assert.Equal(t, 36*time.Hour, c.TraceRetention)

	c, err = parse([]string{"--trace-retention", "0"}, map[string]string{"HERALD_TRACE_RETENTION": "36h"})
	require.NoError(t, err)
	assert.Zero(t, c.TraceRetention, "the flag wins over the environment")

	_, err = parse([]string{"--trace-retention", "-1h"}, nil)
	assert.ErrorContains(t, err, "--trace-retention must not be negative")
	_, err = parse([]string{"--trace-retention", "a week"}, nil)
	assert.Error(t, err)
}
