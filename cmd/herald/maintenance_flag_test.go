package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --buffer-dir defaults to <data-dir>/buffer, with or without a database
// URL; --buffer-max-bytes is at least 1 MiB. (An unusable default:
// internal/server's TestBufferDir.)
func TestFlag_BufferDir(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseConfig("serve", []string{"--data-dir", "/var/lib/herald"}, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/herald/buffer", c.BufferDirOrDefault())
	assert.Equal(t, int64(256<<20), c.BufferMaxBytes)
	c, err = parseConfig("serve", []string{"--database-url", "postgres://x@y/z"},
		func(k string) string { return map[string]string{"HERALD_BUFFER_DIR": "/srv/buf"}[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "/srv/buf", c.BufferDirOrDefault())
	_, err = parseConfig("serve", []string{"--buffer-max-bytes", "1000"}, none, io.Discard)
	require.ErrorContains(t, err, "--buffer-max-bytes")

}
