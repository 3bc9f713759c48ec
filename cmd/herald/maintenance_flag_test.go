package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --buffer-dir defaults to <data-dir>/buffer, with or without a database
// URL; --buffer-max-bytes is at least 1 MiB; an unusable default leaves the
// instance without a buffer instead of refusing to start.
func TestFlag_BufferDir(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseConfig("serve", []string{"--data-dir", "/var/lib/herald"}, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/herald/buffer", c.bufferDir())
	assert.Equal(t, int64(256<<20), c.BufferMaxBytes)
	c, err = parseConfig("serve", []string{"--database-url", "postgres://x@y/z"},
		func(k string) string { return map[string]string{"HERALD_BUFFER_DIR": "/srv/buf"}[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "/srv/buf", c.bufferDir())
	_, err = parseConfig("serve", []string{"--buffer-max-bytes", "1000"}, none, io.Discard)
	require.ErrorContains(t, err, "--buffer-max-bytes")

	blocked := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocked, nil, 0o600))
	c, err = parseConfig("serve", []string{"--data-dir", blocked}, none, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, bufferDir(c, zerolog.Nop()), "a default that cannot be made: no buffer")
	c.BufferDir = filepath.Join(blocked, "buffer")
	assert.Equal(t, c.BufferDir, bufferDir(c, zerolog.Nop()), "an explicit one is the gateway's to refuse")
}
