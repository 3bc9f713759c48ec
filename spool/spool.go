package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/rs/zerolog"
)

// Defaults of Config fields.
const (
	// MaxBytesDefault bounds a Dir's file: 256 MiB holds about a million
	// small messages, and its start-up scan reads it in well under a
	// second.
	MaxBytesDefault = 256 << 20
	// BatchRecordsDefault and BatchBytesDefault bound what one Store call
	// gets: 500 items is a push the queue store merges comfortably into
	// one transaction.
	BatchRecordsDefault = 500
	BatchBytesDefault   = 4 << 20
	// MaxSlots bounds the slot files of a directory (processes sharing it).
	MaxSlots = 64
)

// ErrFull refuses an Append that would take the Dir past Config.MaxBytes.
var ErrFull = errors.New("spool: the buffer is full")

// ErrClosed refuses calls after Close.
var ErrClosed = errors.New("spool: closed")

// Config configures a Dir.
type Config struct {
	// Dir is the directory of the slot files; created (0700) if missing.
	// Required.
	Dir string
	// MaxBytes bounds this process's slot file, headers and framing
	// included; zero means MaxBytesDefault.
	MaxBytes int64
	// BatchRecords and BatchBytes bound one Store call of Drain; zero
	// means BatchRecordsDefault and BatchBytesDefault.
	BatchRecords int
	BatchBytes   int64
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxBytes == 0 {
		c.MaxBytes = MaxBytesDefault
	}
	if c.BatchRecords == 0 {
		c.BatchRecords = BatchRecordsDefault
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = BatchBytesDefault
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("spool: Config.Dir is required")
	case c.MaxBytes < int64(headerSize+frameSize):
		return errors.New("spool: Config.MaxBytes is too small")
	case c.BatchRecords < 0 || c.BatchBytes < 0:
		return errors.New("spool: Config.BatchRecords and BatchBytes must not be negative")
	}
	return nil
}

// Dir is this process's buffer: the slot file it owns in a directory,
// and the right to drain the slots nobody owns.
type Dir struct {
	cfg Config
	log zerolog.Logger
	own *segment

	drainMu sync.Mutex // one Drain at a time; taken before own.mu

	// Guarded by own.mu.
	broken  error  // a failed write could not be cut back off: no more appends
	written uint64 // bytes ever appended (never goes back)
	closed  bool

	syncMu sync.Mutex
	synced uint64 // written, as of the last successful fsync
}

// Open takes the first slot of cfg.Dir no other process holds and scans
// it (what an earlier process left there is kept for Drain).
func Open(cfg Config) (*Dir, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: creating %s: %w", cfg.Dir, err)
	}
	d := &Dir{cfg: cfg, log: cfg.Logger.With().Str("component", "spool").Logger()}
	for slot := range MaxSlots {
		seg, cut, err := openSegment(cfg.Dir, slot, cfg.MaxBytes)
		if errors.Is(err, errNotSpool) {
			d.log.Error().Err(err).Msg("skipping a file that is not a push buffer")
			continue
		}
		if err != nil {
			return nil, err
		}
		if seg == nil {
			continue // another process's
		}
		if cut > 0 {
			d.log.Warn().Str("file", seg.path).Int64("bytes", cut).
				Msg("cut a torn or damaged tail off the push buffer (a write no client was told succeeded, or damage)")
		}
		syncDir(cfg.Dir)
		d.own = seg
		if seg.count > 0 {
			d.log.Info().Str("file", seg.path).Int("records", seg.count).Msg("the push buffer holds records from before")
		}
		return d, nil
	}
	return nil, fmt.Errorf("spool: every one of the %d slots of %s is held by another process", MaxSlots, cfg.Dir)
}

// syncDir makes a new file's directory entry durable; best effort.
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil { // #nosec G304 -- the configured directory
		_ = f.Sync()
		_ = f.Close()
	}
}

// Path is the slot file this process owns.
func (d *Dir) Path() string { return d.own.path }

// Append writes recs at the end of the owned file, all or none, and
// returns once they are on disk (fsync). A record longer than MaxBytes
// less the framing cannot fit and gets ErrFull, as does one that would
// take the file past MaxBytes.
func (d *Dir) Append(recs [][]byte) error {
	if len(recs) == 0 {
		return nil
	}
	buf := frame(nil, recs)
	s := d.own
	s.mu.Lock()
	switch {
	case d.closed:
		s.mu.Unlock()
		return ErrClosed
	case d.broken != nil:
		err := d.broken
		s.mu.Unlock()
		return err
	case s.size+int64(len(buf)) > d.cfg.MaxBytes:
		s.mu.Unlock()
		return ErrFull
	}
	if _, err := s.f.Write(buf); err != nil {
		if terr := s.f.Truncate(s.size); terr != nil {
			d.broken = fmt.Errorf("spool: %s holds a partial write that could not be cut off (%w); restart to recover it", s.path, terr)
			d.log.Error().Err(d.broken).Msg("the push buffer refuses further appends")
		}
		s.mu.Unlock()
		return fmt.Errorf("spool: writing %s: %w", s.path, err)
	}
	s.size += int64(len(buf))
	s.count += len(recs)
	d.written += uint64(len(buf))
	target := d.written
	s.mu.Unlock()
	return d.sync(target)
}

// sync returns once everything written up to target is on disk: one fsync
// covers every append written before it started.
func (d *Dir) sync(target uint64) error {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	if d.synced >= target {
		return nil
	}
	s := d.own
	s.mu.Lock()
	upto := d.written
	s.mu.Unlock()
	if err := s.f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the pages:
		// nothing written since the last good one can be trusted.
		s.mu.Lock()
		if d.broken == nil {
			d.broken = fmt.Errorf("spool: syncing %s failed (%w); restart to recover what it holds", s.path, err)
			d.log.Error().Err(d.broken).Msg("the push buffer refuses further appends")
		}
		s.mu.Unlock()
		return fmt.Errorf("spool: syncing %s: %w", s.path, err)
	}
	d.synced = upto
	return nil
}

// Stats is what a Dir holds.
type Stats struct {
	// Records waiting in the owned file, and the file's size (what
	// MaxBytes bounds, drained records included until it is truncated).
	Records  int
	Bytes    int64
	MaxBytes int64
	Path     string
	// Healthy is false once a failed write or fsync made the Dir refuse
	// appends.
	Healthy bool
}

// Stats reports the owned file's state (slots of stopped processes are
// counted when Drain adopts them).
func (d *Dir) Stats() Stats {
	s := d.own
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Records: s.count, Bytes: s.size, MaxBytes: d.cfg.MaxBytes, Path: s.path, Healthy: d.broken == nil && !d.closed}
}

// Waiting reports whether records may wait: in the owned file, or in
// another slot file (its process may have stopped; Drain finds out).
func (d *Dir) Waiting() bool {
	if d.Stats().Records > 0 {
		return true
	}
	for _, slot := range d.otherSlots() {
		if st, err := os.Stat(slotPath(d.cfg.Dir, slot)); err == nil && st.Size() > int64(headerSize) {
			return true
		}
	}
	return false
}

// Store stores recs, the oldest records waiting, in order, and reports how
// many of them, from the first, are stored now: all, or fewer with an
// error that says why the rest are not (they are offered again at the
// next Drain). It must be idempotent: after a crash, records it stored may
// be offered again.
type Store func(ctx context.Context, recs [][]byte) (stored int, err error)

// Drain offers every waiting record to store, oldest first, in batches:
// the owned file's, then those of slots no process holds (a process that
// stopped while it held records), each file truncated once all of it is
// stored. stop is asked before each batch; true ends the drain (records
// left wait for the next). It returns how many records were stored and
// the first error, which ends the drain.
func (d *Dir) Drain(ctx context.Context, stop func() bool, store Store) (int, error) {
	d.drainMu.Lock()
	defer d.drainMu.Unlock()
	d.own.mu.Lock()
	closed := d.closed
	d.own.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	n, err := d.drain(ctx, d.own, stop, store)
	if err != nil || stop() {
		return n, err
	}
	for _, slot := range d.otherSlots() {
		seg, cut, oerr := openSegment(d.cfg.Dir, slot, d.cfg.MaxBytes)
		if oerr != nil {
			d.log.Error().Err(oerr).Int("slot", slot).Msg("opening the push buffer of a stopped process")
			continue
		}
		if seg == nil {
			continue // its process runs: it drains its own
		}
		if cut > 0 {
			d.log.Warn().Str("file", seg.path).Int64("bytes", cut).Msg("cut a torn or damaged tail off a push buffer")
		}
		if seg.count > 0 {
			d.log.Info().Str("file", seg.path).Int("records", seg.count).Msg("draining the push buffer of a stopped process")
		}
		k, derr := d.drain(ctx, seg, stop, store)
		_ = seg.f.Close() // and its lock
		n += k
		if derr != nil {
			return n, derr
		}
		if stop() {
			break
		}
	}
	return n, nil
}

// otherSlots lists the slots of the directory's files, but the owned one.
func (d *Dir) otherSlots() []int {
	names, err := filepath.Glob(filepath.Join(d.cfg.Dir, "push-*.buf"))
	if err != nil {
		return nil
	}
	var out []int
	for _, name := range names {
		slot, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "push-"), ".buf"))
		if err == nil && slot != d.own.slot && slot >= 0 && slot < MaxSlots {
			out = append(out, slot)
		}
	}
	return out
}

// drain offers s's records to store until none is left, then truncates s.
func (d *Dir) drain(ctx context.Context, s *segment, stop func() bool, store Store) (int, error) {
	n := 0
	for {
		if stop() {
			return n, nil
		}
		s.mu.Lock()
		from, to := s.pos, s.size
		if from == to {
			// All stored, and no append comes while mu is held: start the
			// file again.
			var err error
			if to > int64(headerSize) {
				err = s.restart()
			}
			s.mu.Unlock()
			return n, err
		}
		s.mu.Unlock()
		recs, ends, err := s.read(from, to, d.cfg.BatchRecords, d.cfg.BatchBytes, d.cfg.MaxBytes)
		if err != nil {
			return n, err
		}
		k, serr := store(ctx, recs)
		k = min(max(k, 0), len(recs))
		if k > 0 {
			s.mu.Lock()
			s.pos = ends[k-1]
			s.count -= k
			s.mu.Unlock()
			n += k
			if err := s.writePos(ends[k-1]); err != nil {
				d.log.Warn().Err(err).Msg("the push buffer's position was not recorded: a restart stores those records again")
			}
		}
		if serr != nil {
			return n, serr
		}
		if k < len(recs) {
			return n, fmt.Errorf("spool: %d of %d records were stored, and nothing said why", k, len(recs))
		}
	}
}

// Close releases the owned file and its lock; records stay for the next
// process. Safe to call more than once.
func (d *Dir) Close() error {
	d.drainMu.Lock()
	defer d.drainMu.Unlock()
	d.own.mu.Lock()
	defer d.own.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if err := d.own.f.Close(); err != nil {
		return fmt.Errorf("spool: closing %s: %w", d.own.path, err)
	}
	return nil
}
