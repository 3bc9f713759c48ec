package spool

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzOpen: whatever a slot file holds after its header (a crash, damage),
// Open neither panics nor fails, and every record it keeps drains.
func FuzzOpen(f *testing.F) {
	f.Add(frame(nil, recs(0, 3)))
	f.Add(frame(nil, recs(0, 3))[:20])
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, tail []byte) {
		dir := t.TempDir()
		d, err := Open(Config{Dir: dir, MaxBytes: 1 << 16})
		require.NoError(t, err)
		path := d.Path()
		require.NoError(t, d.Close())
		fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		_, err = fh.Write(tail)
		require.NoError(t, err)
		require.NoError(t, fh.Close())
		d, err = Open(Config{Dir: dir, MaxBytes: 1 << 16})
		require.NoError(t, err)
		defer func() { _ = d.Close() }()
		want := d.Stats().Records
		n, err := d.Drain(context.Background(), never, func(_ context.Context, rs [][]byte) (int, error) { return len(rs), nil })
		require.NoError(t, err)
		require.Equal(t, want, n)
	})
}
