package gateway

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/heraldmq/herald/queue"
)

// An SSE resume token is the id: of every event. It says exactly what the
// browser has received, with no session kept on any server: for each
// partition on which the stream holds a lease, the lease id and the highest
// offset written to the stream. Any instance can decode it, acknowledge what
// it covers and give the rest of those leases back (queue.ResumeLeases).
// It also names the browser's streams (origin, sse_chain.go): the first
// stream draws 16 random bytes, and every stream resumed with a token of
// theirs carries them on, so that the instance that served them knows the
// browser is back.
//
//	byte 0       version (2; 1: no origin, as earlier servers wrote it)
//	bytes 1–16   origin (version 2)
//	per entry    partition id (16 bytes) · lease id (16 bytes, zero with
//	             autoAck) · offset (unsigned varint)
//
// base64url without padding.
const (
	sseTokenVersion   = 2
	sseTokenVersionV1 = 1
)

// streamOrigin names the streams of one browser (a chain of resumes); zero
// is none (a token of version 1).
type streamOrigin [16]byte

// sseMaxTokenEntries bounds a decoded token: a stream holds at most
// maxInFlight leases, and a token is a header line.
const sseMaxTokenEntries = queue.MaxBatch

var errBadToken = errors.New("malformed resume token")

func encodeToken(origin streamOrigin, marks []queue.LeaseMark) string {
	buf := make([]byte, 1, 1+len(origin)+len(marks)*(32+binary.MaxVarintLen64))
	buf[0] = sseTokenVersion
	buf = append(buf, origin[:]...)
	for _, m := range marks {
		buf = appendUUID(buf, m.PartitionID)
		buf = appendUUID(buf, m.LeaseID)
		buf = binary.AppendUvarint(buf, uint64(max(m.Through, 0)))
	}
	return base64.RawURLEncoding.EncodeToString(buf)
}

func decodeToken(s string) (streamOrigin, []queue.LeaseMark, error) {
	var origin streamOrigin
	if s == "" {
		return origin, nil, nil
	}
	if len(s) > 4*(len(origin)+sseMaxTokenEntries*(32+binary.MaxVarintLen64))/3+8 {
		return streamOrigin{}, nil, errBadToken
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 || (b[0] != sseTokenVersion && b[0] != sseTokenVersionV1) {
		return streamOrigin{}, nil, errBadToken
	}
	version := b[0]
	b = b[1:]
	if version == sseTokenVersion {
		if len(b) < len(origin) {
			return streamOrigin{}, nil, errBadToken
		}
		copy(origin[:], b)
		b = b[len(origin):]
	}
	var out []queue.LeaseMark
	for len(b) > 0 {
		if len(b) < 33 || len(out) == sseMaxTokenEntries {
			return streamOrigin{}, nil, errBadToken
		}
		m := queue.LeaseMark{PartitionID: formatUUID(b[:16]), LeaseID: formatUUID(b[16:32])}
		through, n := binary.Uvarint(b[32:])
		if n <= 0 || through > 1<<62 {
			return streamOrigin{}, nil, errBadToken
		}
		m.Through = int64(through)
		if m.LeaseID == zeroUUID {
			m.LeaseID = ""
		}
		out = append(out, m)
		b = b[32+n:]
	}
	return origin, out, nil
}

const zeroUUID = "00000000-0000-0000-0000-000000000000"

// appendUUID appends the 16 bytes of a canonical UUID; anything else
// (an autoAck stream's empty lease) appends zeros.
func appendUUID(buf []byte, id string) []byte {
	var raw [16]byte
	if queue.ValidUUID(id) {
		_, _ = hex.Decode(raw[:], []byte(strings.ReplaceAll(id, "-", "")))
	}
	return append(buf, raw[:]...)
}

func formatUUID(b []byte) string {
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
