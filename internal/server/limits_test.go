package server

import (
	"syscall"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The connection cap keeps the documented reserve below the open-file
// limit; --max-connections may lower it, never raise it; a limit that
// leaves almost nothing is refused at start.
func TestConnectionLimit_KeepsAReserveBelowTheOpenFileLimit(t *testing.T) {
	for _, tc := range []struct {
		soft       uint64
		pool, max  int
		want       int
		wantErrors bool
	}{
		{soft: 1024, pool: 4, want: 880},    // 1024 − (4 + 2 + 64 + 64 + 10)
		{soft: 65536, pool: 4, want: 64747}, // 65536 − (4 + 2 + 64 + 64 + 655)
		{soft: 20000, pool: 20, want: 19650},
		{soft: 1024, pool: 4, max: 100, want: 100},
		{soft: 1024, pool: 4, max: 5000, want: 880},
		{soft: 140, pool: 4, wantErrors: true},
	} {
		got, err := connectionLimit(&Config{MaxConnections: tc.max}, tc.soft, tc.pool, zerolog.Nop())
		if tc.wantErrors {
			assert.ErrorContains(t, err, "open-file limit", "%+v", tc)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%+v", tc)
	}
}

// At start the soft limit is raised to the hard one.
func TestRaiseOpenFileLimit_ToTheHardLimit(t *testing.T) {
	soft, err := raiseOpenFileLimit(zerolog.Nop())
	require.NoError(t, err)
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Max != rlimInfinity {
		assert.Equal(t, lim.Max, lim.Cur)
	}
	assert.Equal(t, lim.Cur, soft)
}
