package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An unusable default buffer directory leaves the instance without a
// buffer instead of refusing to start; an explicit one is passed on, for
// the gateway to refuse.
func TestBufferDir(t *testing.T) {
	blocked := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocked, nil, 0o600))
	c := &Config{DataDir: blocked}
	assert.Empty(t, bufferDir(c, zerolog.Nop()), "a default that cannot be made: no buffer")
	c.BufferDir = filepath.Join(blocked, "buffer")
	assert.Equal(t, c.BufferDir, bufferDir(c, zerolog.Nop()), "an explicit one is the gateway's to refuse")
	ok := &Config{DataDir: t.TempDir()}
	assert.Equal(t, filepath.Join(ok.DataDir, "buffer"), bufferDir(ok, zerolog.Nop()))
	assert.DirExists(t, filepath.Join(ok.DataDir, "buffer"))
	assert.Empty(t, bufferDir(&Config{DatabaseURL: "postgres://x"}, zerolog.Nop()), "no data directory, no default buffer")
}

// Zero days of partition cleanup and zero trace retention mean never,
// which the store spells as negative.
func TestStoreDurations(t *testing.T) {
	assert.Negative(t, cleanupAfter(0))
	assert.Equal(t, 48*time.Hour, cleanupAfter(2))
	assert.Negative(t, traceRetention(0))
	assert.Equal(t, 7*24*time.Hour, traceRetention(7*24*time.Hour))
}

func TestConfig_Validate(t *testing.T) {
	ok := Config{Addr: "127.0.0.1:0", DatabaseURL: "postgres://x"}.WithDefaults()
	require.NoError(t, ok.Validate())
	assert.Equal(t, WakeNotify, ok.Wake)
	for name, c := range map[string]Config{
		"Listener or Config.Addr": {DatabaseURL: "postgres://x"},
		"DataDir":                 {Addr: ":0"},
		"Wake":                    {Addr: ":0", DatabaseURL: "postgres://x", Wake: "smoke"},
		"EncryptionKey":           {Addr: ":0", DatabaseURL: "postgres://x", EncryptionKey: "abc"},
		"DBMaxConns":              {Addr: ":0", DatabaseURL: "postgres://x", DBMaxConns: 1},
		"PartitionCleanupDays":    {Addr: ":0", DatabaseURL: "postgres://x", PartitionCleanupDays: 213504},
	} {
		assert.ErrorContains(t, c.WithDefaults().Validate(), name)
	}
}
