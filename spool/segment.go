package spool

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// A slot file starts with a header: magic, then a random epoch drawn each
// time the file is (re)started empty. The .pos file names the epoch it
// counts in, so a position written before a truncation, and found again
// after a crash, never skips records of the next epoch.
const (
	magic      = "hspool01"
	headerSize = len(magic) + 8
	frameSize  = 8 // length + CRC-32C
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errNotSpool: a slot file that does not start with the magic.
var errNotSpool = errors.New("not a spool file")

// segment is one slot file, locked by this process.
type segment struct {
	slot    int
	path    string
	posPath string
	f       *os.File

	mu    sync.Mutex
	epoch uint64
	size  int64 // bytes of valid header and records
	pos   int64 // the drained prefix (≥ headerSize)
	count int   // records after pos
}

func slotPath(dir string, slot int) string {
	return filepath.Join(dir, "push-"+strconv.Itoa(slot)+".buf")
}

// openSegment opens and locks a slot file, creating it if needed, and
// scans it; nil, nil when another open file holds its lock. maxRecord
// bounds a record's length: a longer one can only be damage.
func openSegment(dir string, slot int, maxRecord int64) (seg *segment, cut int64, err error) {
	path := slotPath(dir, slot)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600) // #nosec G304 -- a path this package builds
	if err != nil {
		return nil, 0, fmt.Errorf("spool: opening %s: %w", path, err)
	}
	ok, err := lockFile(f)
	if err != nil || !ok {
		_ = f.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("spool: locking %s: %w", path, err)
		}
		return nil, 0, nil
	}
	seg = &segment{slot: slot, path: path, posPath: strings.TrimSuffix(path, ".buf") + ".pos", f: f}
	if cut, err = seg.scan(maxRecord); err != nil {
		_ = f.Close()
		return nil, 0, err
	}
	return seg, cut, nil
}

// scan reads the header (writing one into an empty or torn file), then
// every record, cuts off a torn or damaged tail, and restores the drained
// position. It reports how many bytes it cut off.
func (s *segment) scan(maxRecord int64) (cut int64, err error) {
	st, err := s.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("spool: reading %s: %w", s.path, err)
	}
	if st.Size() < int64(headerSize) {
		// New, or torn while its header was written: no record was ever
		// appended to it (the header is synced first).
		return 0, s.restart()
	}
	var hdr [headerSize]byte
	if _, err := s.f.ReadAt(hdr[:], 0); err != nil {
		return 0, fmt.Errorf("spool: reading %s: %w", s.path, err)
	}
	if string(hdr[:len(magic)]) != magic {
		return 0, fmt.Errorf("spool: %s: %w", s.path, errNotSpool)
	}
	s.epoch = binary.BigEndian.Uint64(hdr[len(magic):])
	pos := s.readPos()
	var boundaries []int64
	end := int64(headerSize)
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, end, st.Size()-end), 1<<16)
	for {
		n, err := skipRecord(r, maxRecord)
		if err != nil {
			break // end of file, or a torn or damaged record: the valid data ends here
		}
		end += n
		boundaries = append(boundaries, end)
	}
	if cut = st.Size() - end; cut > 0 {
		if err := s.f.Truncate(end); err != nil {
			return 0, fmt.Errorf("spool: cutting the torn tail of %s: %w", s.path, err)
		}
		if err := s.f.Sync(); err != nil {
			return 0, fmt.Errorf("spool: syncing %s: %w", s.path, err)
		}
	}
	s.size, s.pos, s.count = end, int64(headerSize), len(boundaries)
	for i, b := range boundaries {
		if b == pos {
			s.pos, s.count = pos, len(boundaries)-i-1
		}
	}
	return cut, nil
}

// skipRecord reads one record, checking its checksum, and returns its
// length with its frame.
func skipRecord(r *bufio.Reader, maxRecord int64) (int64, error) {
	data, err := readRecord(r, maxRecord)
	if err != nil {
		return 0, err
	}
	return int64(frameSize + len(data)), nil
}

// errDamaged: a record whose length or checksum is impossible.
var errDamaged = errors.New("damaged record")

func readRecord(r *bufio.Reader, maxRecord int64) ([]byte, error) {
	var fr [frameSize]byte
	if _, err := io.ReadFull(r, fr[:]); err != nil {
		return nil, err
	}
	n := int64(binary.BigEndian.Uint32(fr[:4]))
	if n > maxRecord {
		return nil, errDamaged
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, err
	}
	if crc32.Checksum(data, castagnoli) != binary.BigEndian.Uint32(fr[4:]) {
		return nil, errDamaged
	}
	return data, nil
}

// frame appends recs, framed, to buf.
func frame(buf []byte, recs [][]byte) []byte {
	for _, rec := range recs {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(rec))) // #nosec G115 -- bounded by MaxBytes
		buf = binary.BigEndian.AppendUint32(buf, crc32.Checksum(rec, castagnoli))
		buf = append(buf, rec...)
	}
	return buf
}

// restart empties the file under a new epoch and syncs it. Called at open
// or, with mu, once everything was drained.
func (s *segment) restart() error {
	var e [8]byte
	_, _ = rand.Read(e[:])
	s.epoch = binary.BigEndian.Uint64(e[:])
	if err := s.f.Truncate(0); err != nil {
		return fmt.Errorf("spool: truncating %s: %w", s.path, err)
	}
	hdr := append([]byte(magic), e[:]...)
	if _, err := s.f.Write(hdr); err != nil {
		return fmt.Errorf("spool: writing the header of %s: %w", s.path, err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("spool: syncing %s: %w", s.path, err)
	}
	s.size, s.pos, s.count = int64(headerSize), int64(headerSize), 0
	_ = os.Remove(s.posPath) // of the old epoch: ignored if it comes back
	return nil
}

// readPos is the drained position the .pos file records for this epoch,
// or 0 (nothing drained) when it records none.
func (s *segment) readPos() int64 {
	b, err := os.ReadFile(s.posPath) // #nosec G304 -- a path this package builds
	if err != nil {
		return 0
	}
	epoch, pos, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !ok || epoch != s.epochHex() {
		return 0
	}
	n, err := strconv.ParseInt(pos, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func (s *segment) epochHex() string {
	var e [8]byte
	binary.BigEndian.PutUint64(e[:], s.epoch)
	return hex.EncodeToString(e[:])
}

// writePos records the drained position. Not synced: a position lost in a
// crash means storing those records again, which the caller makes
// idempotent.
func (s *segment) writePos(pos int64) error {
	if err := os.WriteFile(s.posPath, []byte(s.epochHex()+" "+strconv.FormatInt(pos, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("spool: recording the drained position of %s: %w", s.path, err)
	}
	return nil
}

// read returns the records between from and to (record boundaries), at
// most maxRecords of them and about maxBytes (at least one), and the end
// offset of each.
func (s *segment) read(from, to int64, maxRecords int, maxBytes, maxRecord int64) (recs [][]byte, ends []int64, err error) {
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, from, to-from), 1<<16)
	at, bytes := from, int64(0)
	for at < to && len(recs) < maxRecords && (len(recs) == 0 || bytes < maxBytes) {
		data, err := readRecord(r, maxRecord)
		if err != nil {
			return nil, nil, fmt.Errorf("spool: reading %s at %d: %w", s.path, at, err)
		}
		at += int64(frameSize + len(data))
		bytes += int64(len(data))
		recs, ends = append(recs, data), append(ends, at)
	}
	return recs, ends, nil
}
