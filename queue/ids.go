package queue

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

// UUIDv7 ids (RFC 9562) sort by creation time, which keeps message and lease
// ids index-friendly and readable in logs. Within one millisecond a counter in
// rand_a keeps ids from this process strictly increasing.
var idGen struct {
	mu     sync.Mutex
	lastMS int64
	seq    uint16
}

// newID returns a new UUIDv7 as 16 bytes.
func newID() [16]byte {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms

	idGen.mu.Lock()
	ms := time.Now().UnixMilli()
	if ms <= idGen.lastMS {
		ms = idGen.lastMS
		idGen.seq++
		if idGen.seq > 0x0fff {
			// Counter exhausted: borrow the next millisecond, as RFC 9562 §6.2 allows.
			ms++
			idGen.seq = 0
		}
	} else {
		idGen.seq = 0
	}
	idGen.lastMS = ms
	seq := idGen.seq
	idGen.mu.Unlock()

	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(ms))
	copy(b[0:6], ts[2:8])
	b[6] = 0x70 | byte(seq>>8)
	b[7] = byte(seq)
	b[8] = 0x80 | (b[8] & 0x3f)
	return b
}

// formatUUID renders 16 bytes in the canonical 8-4-4-4-12 form.
func formatUUID(b [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// NewID returns a new UUIDv7 string.
func NewID() string { return formatUUID(newID()) }

// ValidUUID reports whether s is a canonical (hyphenated, any case) UUID, so
// that a malformed id from a client can be answered "not found" instead of
// reaching Postgres as a cast error.
func ValidUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			isHex := c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
			if !isHex {
				return false
			}
		}
	}
	return true
}
