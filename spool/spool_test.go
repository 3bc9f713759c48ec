package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string, adjust ...func(*Config)) *Dir {
	t.Helper()
	cfg := Config{Dir: dir}
	for _, f := range adjust {
		f(&cfg)
	}
	d, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func recs(from, to int) [][]byte {
	var out [][]byte
	for i := from; i < to; i++ {
		out = append(out, []byte(fmt.Sprintf("r%d", i)))
	}
	return out
}

// sink is a Store that keeps what it is given, in order.
type sink struct {
	mu  sync.Mutex
	got []string
}

func (s *sink) store(_ context.Context, rs [][]byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		s.got = append(s.got, string(r))
	}
	return len(rs), nil
}

func names(from, to int) []string {
	var out []string
	for _, r := range recs(from, to) {
		out = append(out, string(r))
	}
	return out
}

func never() bool { return false }

func TestDir_AppendDrain(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir, func(c *Config) { c.BatchRecords = 3 })
	for i := 0; i < 10; i += 2 {
		require.NoError(t, d.Append(recs(i, i+2)))
	}
	st := d.Stats()
	assert.Equal(t, 10, st.Records)
	assert.True(t, st.Healthy)
	var s sink
	var calls int
	n, err := d.Drain(context.Background(), never, func(ctx context.Context, rs [][]byte) (int, error) {
		calls++
		assert.LessOrEqual(t, len(rs), 3)
		return s.store(ctx, rs)
	})
	require.NoError(t, err)
	assert.Equal(t, 10, n)
	assert.Equal(t, names(0, 10), s.got, "in order, each once")
	assert.Equal(t, 4, calls)
	st = d.Stats()
	assert.Equal(t, 0, st.Records)
	assert.Equal(t, int64(headerSize), st.Bytes, "truncated once drained")
	// Nothing left: a second drain stores nothing.
	n, err = d.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestDir_ReopenKeepsRecords(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	require.NoError(t, d.Append(recs(0, 5)))
	require.NoError(t, d.Close()) // a stop (or crash) while buffering
	d2 := open(t, dir)
	assert.Equal(t, 5, d2.Stats().Records)
	var s sink
	_, err := d2.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Equal(t, names(0, 5), s.got)
}

func TestDir_TornTail(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	require.NoError(t, d.Append(recs(0, 3)))
	path := d.Path()
	require.NoError(t, d.Close())
	// A crash in the middle of a write: a frame whose data never arrived.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(frame(nil, [][]byte{[]byte("never acknowledged")})[:12])
	require.NoError(t, err)
	require.NoError(t, f.Close())
	d2 := open(t, dir)
	assert.Equal(t, 3, d2.Stats().Records)
	require.NoError(t, d2.Append(recs(3, 4)), "appends go after the cut")
	var s sink
	_, err = d2.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Equal(t, names(0, 4), s.got)
}

func TestDir_DamagedRecord(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	require.NoError(t, d.Append(recs(0, 3)))
	path := d.Path()
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)-1] ^= 0xff // the last record's data no longer matches its checksum
	require.NoError(t, os.WriteFile(path, b, 0o600))
	d2 := open(t, dir)
	assert.Equal(t, 2, d2.Stats().Records)
}

func TestDir_InterruptedDrain(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir, func(c *Config) { c.BatchRecords = 4 })
	require.NoError(t, d.Append(recs(0, 10)))
	var s sink
	boom := errors.New("database down")
	// The first batch is stored, the second only half: the store says so.
	calls := 0
	n, err := d.Drain(context.Background(), never, func(ctx context.Context, rs [][]byte) (int, error) {
		calls++
		if calls == 2 {
			_, _ = s.store(ctx, rs[:2])
			return 2, boom
		}
		return s.store(ctx, rs)
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 6, n)
	assert.Equal(t, 4, d.Stats().Records)
	require.NoError(t, d.Close())

	// A restart resumes where the position says.
	d2 := open(t, dir, func(c *Config) { c.BatchRecords = 4 })
	assert.Equal(t, 4, d2.Stats().Records)
	_, err = d2.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Equal(t, names(0, 10), s.got)
}

func TestDir_LostPositionDrainsAgain(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir, func(c *Config) { c.BatchRecords = 4 })
	require.NoError(t, d.Append(recs(0, 10)))
	calls := 0
	_, err := d.Drain(context.Background(), never, func(_ context.Context, rs [][]byte) (int, error) {
		calls++
		if calls == 2 {
			return 0, errors.New("crash")
		}
		return len(rs), nil
	})
	require.Error(t, err)
	require.NoError(t, d.Close())
	// The position was never synced: a crash may lose it. Everything is
	// offered again (the caller's Store is idempotent).
	require.NoError(t, os.Remove(strings.TrimSuffix(d.Path(), ".buf")+".pos"))
	d2 := open(t, dir)
	assert.Equal(t, 10, d2.Stats().Records)
}

func TestDir_StalePositionOfAnEarlierEpoch(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	require.NoError(t, d.Append(recs(0, 4)))
	posPath := strings.TrimSuffix(d.Path(), ".buf") + ".pos"
	var s sink
	_, err := d.Drain(context.Background(), never, func(ctx context.Context, rs [][]byte) (int, error) {
		return s.store(ctx, rs[:2])
	})
	require.Error(t, err, "fewer stored without a reason is an error")
	old, err := os.ReadFile(posPath)
	require.NoError(t, err)
	_, err = d.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	// Drained and restarted; new records arrive, then a crash brings the
	// old epoch's position file back.
	require.NoError(t, d.Append(recs(4, 8)))
	require.NoError(t, d.Close())
	require.NoError(t, os.WriteFile(posPath, old, 0o600))
	d2 := open(t, dir)
	assert.Equal(t, 4, d2.Stats().Records, "a position of another epoch skips nothing")
}

func TestDir_Full(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir, func(c *Config) { c.MaxBytes = int64(headerSize) + 3*(frameSize+2) })
	require.NoError(t, d.Append(recs(0, 3)))
	require.ErrorIs(t, d.Append(recs(3, 4)), ErrFull)
	assert.Equal(t, 3, d.Stats().Records, "a refused append writes nothing")
	var s sink
	_, err := d.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	require.NoError(t, d.Append(recs(3, 4)), "room again once drained")
}

func TestDir_StopEndsDrain(t *testing.T) {
	d := open(t, t.TempDir(), func(c *Config) { c.BatchRecords = 2 })
	require.NoError(t, d.Append(recs(0, 6)))
	var s sink
	stopped := false
	n, err := d.Drain(context.Background(), func() bool { return stopped }, func(ctx context.Context, rs [][]byte) (int, error) {
		stopped = true // maintenance came back on
		return s.store(ctx, rs)
	})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, 4, d.Stats().Records)
}

func TestDir_AdoptsStoppedProcessSlot(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir)
	b := open(t, dir) // another process on the same directory: the next slot
	require.NotEqual(t, a.Path(), b.Path())
	require.NoError(t, a.Append(recs(0, 2)))
	require.NoError(t, b.Append(recs(2, 5)))
	var s sink
	// b still runs: a drains only its own.
	n, err := a.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	// b stops while holding records: a adopts them.
	require.NoError(t, b.Close())
	n, err = a.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, names(0, 5), s.got)
	// Its file is empty now: a new process on slot 1 finds nothing.
	c := open(t, dir)
	assert.Equal(t, b.Path(), c.Path())
	assert.Zero(t, c.Stats().Records)
}

func TestDir_SkipsForeignFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "push-0.buf"), []byte("something else entirely"), 0o600))
	d := open(t, dir)
	assert.Equal(t, filepath.Join(dir, "push-1.buf"), d.Path())
}

func TestDir_ConcurrentAppends(t *testing.T) {
	d := open(t, t.TempDir())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				assert.NoError(t, d.Append(recs(g*100+i, g*100+i+1)))
			}
		})
	}
	wg.Wait()
	var s sink
	n, err := d.Drain(context.Background(), never, s.store)
	require.NoError(t, err)
	assert.Equal(t, 200, n)
	// Each writer's records keep their order.
	last := map[byte]int{}
	for _, r := range s.got {
		var v int
		_, _ = fmt.Sscanf(r, "r%d", &v)
		g := byte(v / 100)
		assert.Greater(t, v%100+1, last[g])
		last[g] = v%100 + 1
	}
}

func TestConfig_Validate(t *testing.T) {
	_, err := Open(Config{})
	require.ErrorContains(t, err, "Config.Dir")
	_, err = Open(Config{Dir: t.TempDir(), MaxBytes: 5})
	require.ErrorContains(t, err, "MaxBytes")
}
