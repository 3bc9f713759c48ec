package syncnet

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
)

// Wire format v1 (UDPSYNC), byte-compatible with the reference server:
//
//	offset size field
//	0      1    version (1)
//	1      1    type
//	2      2    payload length, big-endian
//	4      32   HMAC-SHA256 signature
//	36     32   sender id, ASCII, NUL-padded (at most 31 bytes)
//	68     16   session id, ASCII, NUL-padded (15 characters and a NUL)
//	84     8    sequence, big-endian
//	92     n    MessagePack payload
//
// The MAC key is the secret's ASCII bytes (not hex-decoded); the MAC input
// is bytes 0–3 followed by byte 36 to the end of the datagram.
const (
	Version     = 1
	HeaderSize  = 92
	MaxDatagram = 1400
	MaxPayload  = MaxDatagram - HeaderSize // 1308
	maxSenderID = 31
	maxSession  = 15
)

// Type is a message type. The numbers are the seed's and the reference
// server's; the list is append-only.
type Type uint8

// Message types.
const (
	MessageAvailable      Type = 1
	PartitionFree         Type = 2 // defined, never sent
	Heartbeat             Type = 3
	QueueConfigSet        Type = 10
	QueueConfigDelete     Type = 11
	ConsumerRegistered    Type = 20
	ConsumerDeregistered  Type = 21
	PartitionDeleted      Type = 25
	LeaseHintAcquired     Type = 30
	LeaseHintReleased     Type = 31
	MaintenanceModeSet    Type = 40
	PopMaintenanceModeSet Type = 41
	// Herald's own, sent only to peers the database lists as Herald
	// instances (members.go); the reference server ignores unknown types.
	PresenceSet  Type = 50
	PresencePull Type = 51
)

var typeNames = map[Type]string{
	MessageAvailable: "message_available", PartitionFree: "partition_free", Heartbeat: "heartbeat",
	QueueConfigSet: "queue_config_set", QueueConfigDelete: "queue_config_delete",
	ConsumerRegistered: "consumer_registered", ConsumerDeregistered: "consumer_deregistered",
	PartitionDeleted: "partition_deleted", LeaseHintAcquired: "lease_hint_acquired",
	LeaseHintReleased: "lease_hint_released", MaintenanceModeSet: "maintenance_mode_set",
	PopMaintenanceModeSet: "pop_maintenance_mode_set", PresenceSet: "presence_set", PresencePull: "presence_pull",
}

func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type_%d", uint8(t))
}

// Header is a datagram's header, signature aside.
type Header struct {
	Type     Type
	SenderID string
	Session  string // as carried: at most 15 characters
	Sequence uint64
}

// Packet is a verified, decoded datagram.
type Packet struct {
	Header
	Payload []byte // MessagePack; aliases the datagram
}

// Decode errors, one per drop reason (they name the metric label).
var (
	ErrTooShort     = errors.New("shorter than the header")
	ErrTooLong      = errors.New("longer than a datagram may be")
	ErrVersion      = errors.New("unknown version")
	ErrLength       = errors.New("payload length beyond the datagram")
	ErrSignature    = errors.New("signature does not verify")
	ErrPayloadLarge = errors.New("payload larger than a datagram holds")
)

// Reason names a decode error for metrics ("" for nil).
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrTooShort):
		return "too_short"
	case errors.Is(err, ErrTooLong):
		return "too_long"
	case errors.Is(err, ErrVersion):
		return "version"
	case errors.Is(err, ErrLength):
		return "length"
	case errors.Is(err, ErrSignature):
		return "signature"
	}
	return "malformed"
}

// Encode builds a datagram signed with key (the secret's bytes). It refuses
// a payload that would make the datagram larger than MaxDatagram.
func Encode(h Header, payload []byte, key []byte) ([]byte, error) {
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("%w: %d bytes", ErrPayloadLarge, len(payload))
	}
	b := make([]byte, HeaderSize+len(payload))
	b[0] = Version
	b[1] = byte(h.Type)
	binary.BigEndian.PutUint16(b[2:4], uint16(len(payload))) // #nosec G115 -- bounded by MaxPayload
	copy(b[36:36+maxSenderID], h.SenderID)
	copy(b[68:68+maxSession], h.Session)
	binary.BigEndian.PutUint64(b[84:92], h.Sequence)
	copy(b[HeaderSize:], payload)
	if len(key) > 0 {
		sign(key, b, b[4:4:36])
	}
	return b, nil
}

// macs keeps keyed HMAC states: hmac.New allocates two SHA-256 states and
// hashes the key's pads on every call, a third of a small datagram's cost.
var macs sync.Map // string(key) → *sync.Pool of hash.Hash

// sign is HMAC-SHA256 over bytes 0–3 and 36 to the end, into out.
func sign(key, b []byte, out []byte) []byte {
	pv, ok := macs.Load(string(key))
	if !ok {
		k := append([]byte(nil), key...)
		pv, _ = macs.LoadOrStore(string(key), &sync.Pool{New: func() any { return hmac.New(sha256.New, k) }})
	}
	pool := pv.(*sync.Pool)
	m := pool.Get().(hash.Hash)
	m.Reset()
	m.Write(b[0:4])
	m.Write(b[36:])
	out = m.Sum(out)
	pool.Put(m)
	return out
}

// Decode checks a datagram and returns it. With an empty key the signature
// is not checked (as the reference server does without a secret). The MAC
// covers the whole datagram, bytes after the payload included.
func Decode(b []byte, key []byte) (Packet, error) {
	var p Packet
	switch {
	case len(b) < HeaderSize:
		return p, ErrTooShort
	case len(b) > MaxDatagram:
		return p, ErrTooLong
	case b[0] != Version:
		return p, ErrVersion
	}
	n := int(binary.BigEndian.Uint16(b[2:4]))
	if HeaderSize+n > len(b) {
		return p, ErrLength
	}
	if len(key) > 0 && !hmac.Equal(b[4:36], sign(key, b, make([]byte, 0, sha256.Size))) {
		return p, ErrSignature
	}
	p.Type = Type(b[1])
	p.SenderID = cstring(b[36:68])
	p.Session = cstring(b[68:84])
	p.Sequence = binary.BigEndian.Uint64(b[84:92])
	p.Payload = b[HeaderSize : HeaderSize+n]
	return p, nil
}

// cstring reads a NUL-padded field.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
