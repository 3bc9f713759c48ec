package syncnet

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// golden is one datagram captured from the reference server.
type golden struct {
	Type   int    `json:"type"`
	Name   string `json:"type_name"`
	Hex    string `json:"hex"`
	Secret string `json:"secret"`
	Header struct {
		Version       int    `json:"version"`
		Type          int    `json:"type"`
		PayloadLength int    `json:"payload_length"`
		SenderID      string `json:"sender_id"`
		SessionID     string `json:"session_id"`
		Sequence      uint64 `json:"sequence"`
	} `json:"decoded_header"`
	Payload json.RawMessage `json:"decoded_payload"`
}

// goldenPath holds datagrams captured from the reference server (a copy of
// shared/testdata/reference-server/syncnet-packets.json).
const goldenPath = "testdata/reference-packets.json"

func loadGolden(t *testing.T) []golden {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(goldenPath))
	require.NoError(t, err)
	var gs []golden
	require.NoError(t, json.Unmarshal(b, &gs))
	require.Len(t, gs, 12)
	return gs
}

// Every captured datagram verifies with the secret's ASCII bytes (and not
// with the hex-decoded key), decodes to the captured header and payload, and
// re-encodes to the very same bytes.
func TestGolden_ReferenceServerDatagrams(t *testing.T) {
	for _, g := range loadGolden(t) {
		t.Run(g.Name, func(t *testing.T) {
			dgram, err := hex.DecodeString(g.Hex)
			require.NoError(t, err)
			key := []byte(g.Secret)
			p, err := Decode(dgram, key)
			require.NoError(t, err)
			hexKey, _ := hex.DecodeString(g.Secret)
			_, err = Decode(dgram, hexKey)
			assert.ErrorIs(t, err, ErrSignature, "a hex-decoded key must not verify")

			assert.Equal(t, Type(g.Header.Type), p.Type)
			assert.Equal(t, g.Header.SenderID, p.SenderID)
			assert.Equal(t, g.Header.SessionID, p.Session)
			assert.Equal(t, g.Header.Sequence, p.Sequence)
			assert.Len(t, p.Payload, g.Header.PayloadLength)

			var v any
			switch p.Type {
			case MessageAvailable:
				v = &MessageAvailablePayload{}
			case Heartbeat:
				v = &HeartbeatPayload{}
			case QueueConfigSet:
				v = &QueueConfigSetPayload{}
			case QueueConfigDelete:
				v = &QueueConfigDeletePayload{}
			case MaintenanceModeSet, PopMaintenanceModeSet:
				v = &MaintenancePayload{}
			default:
				t.Fatalf("no payload type for %v", p.Type)
			}
			require.NoError(t, Unmarshal(p.Payload, v))
			// Decoded values match the capture's own decoding.
			var raw map[string]any
			require.NoError(t, Unmarshal(p.Payload, &raw))
			var want, got map[string]any
			require.NoError(t, json.Unmarshal(g.Payload, &want))
			js, err := json.Marshal(raw)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(js, &got))
			assert.Equal(t, want, got)
			assert.ElementsMatch(t, keysOf(want), fieldsOf(t, v), "every captured field is known to the payload type")

			// Byte for byte: the same header and payload encode to the capture.
			payload, err := Marshal(v)
			require.NoError(t, err)
			assert.Equal(t, hex.EncodeToString(p.Payload), hex.EncodeToString(payload), "payload bytes")
			again, err := Encode(p.Header, payload, key)
			require.NoError(t, err)
			assert.Equal(t, g.Hex, hex.EncodeToString(again), "datagram bytes")
		})
	}
}

func keysOf(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// fieldsOf lists the MessagePack keys a payload struct writes.
func fieldsOf(t *testing.T, v any) []string {
	t.Helper()
	b, err := Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, Unmarshal(b, &m))
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// A fixed packet written out byte by byte: the layout as documented.
func TestEncode_GoldenPacket(t *testing.T) {
	payload, err := Marshal(MessageAvailablePayload{Partition: "p", Queue: "q", TS: 1})
	require.NoError(t, err)
	// {"partition":"p","queue":"q","ts":1}
	require.Equal(t, "83a9706172746974696f6ea170a57175657565a171a2747301", hex.EncodeToString(payload))
	b, err := Encode(Header{Type: MessageAvailable, SenderID: "a:6633", Session: "0123456789abcdef", Sequence: 7}, payload, []byte("k"))
	require.NoError(t, err)
	want := "01" + "01" + "0019" + // version, type, payload length 25
		"" // signature follows
	assert.Equal(t, want, hex.EncodeToString(b[:4]))
	assert.Equal(t, "613a363633330000000000000000000000000000000000000000000000000000", hex.EncodeToString(b[36:68]), "sender id, NUL-padded")
	assert.Equal(t, "30313233343536373839616263646500", hex.EncodeToString(b[68:84]), "session: 15 characters and a NUL")
	assert.Equal(t, "0000000000000007", hex.EncodeToString(b[84:92]))
	assert.Equal(t, payload, b[92:])
	assert.Equal(t, "92a03b85b7c5426533abdac1e2d368fa30ac670dd2daa81b5a479bfe9dcf5bcb", hex.EncodeToString(b[4:36]), "signature (computed independently with Python hmac)")
}

func TestDecode_Rejects(t *testing.T) {
	key := []byte("secret")
	good, err := Encode(Header{Type: Heartbeat, SenderID: "x:1", Session: "s", Sequence: 1}, []byte{0x80}, key)
	require.NoError(t, err)
	_, err = Decode(good, key)
	require.NoError(t, err)

	forged := bytes.Clone(good)
	forged[20] ^= 1
	tampered := bytes.Clone(good)
	tampered[len(tampered)-1] ^= 1
	version := bytes.Clone(good)
	version[0] = 2
	long := bytes.Clone(good)
	long[3] = 200 // payload length beyond the datagram
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"forged signature": {forged, ErrSignature},
		"tampered payload": {tampered, ErrSignature},
		"truncated":        {good[:91], ErrTooShort},
		"empty":            {nil, ErrTooShort},
		"version 2":        {version, ErrVersion},
		"oversized length": {long, ErrLength},
		"too long":         {make([]byte, MaxDatagram+1), ErrTooLong},
	} {
		_, err := Decode(tc.b, key)
		assert.ErrorIs(t, err, tc.want, name)
		assert.NotEmpty(t, Reason(err), name)
	}

	// Bytes after the payload are covered by the MAC, as the reference does.
	junk := append(bytes.Clone(good), 1, 2, 3)
	sign(key, junk, junk[4:4:36])
	_, err = Decode(junk, key)
	assert.NoError(t, err)

	_, err = Encode(Header{Type: QueueConfigSet}, make([]byte, MaxPayload+1), key)
	assert.ErrorIs(t, err, ErrPayloadLarge, "refused at encode time")
	_, err = Encode(Header{Type: QueueConfigSet}, make([]byte, MaxPayload), key)
	assert.NoError(t, err)
}

// The reference server's receiver rules (syncnet-rules.md §7), made
// strict about sessions (replayed datagrams): a session is adopted only by a
// fresh signed ts later than the current session's, and a superseded one
// never comes back.
func TestReplay_Rules(t *testing.T) {
	w := time.Minute
	r := NewReplay(w)
	now := time.UnixMilli(1_800_000_000_000)
	ms := func(d time.Duration) uint64 { return uint64(now.Add(d).UnixMilli()) }
	steps := []struct {
		session string
		seq     uint64
		ts      uint64 // 0: the type carries none
		at      time.Duration
		want    string
	}{
		{"s1", 5, 0, 0, "unknown_session"},                                  // first from a sender: needs a ts
		{"s1", 5, ms(0), 0, ""},                                             // accepted whatever the sequence
		{"s1", 5, ms(0), 0, "replay"},                                       // replay
		{"s1", 4, 0, 0, "replay"},                                           // older
		{"s1", 7, 0, 0, ""},                                                 // gaps are allowed; no ts needed in session
		{"s1", 8, ms(-w - time.Millisecond), 0, "stale_timestamp"},          // too old
		{"s1", 8, ms(w + time.Millisecond), 0, "stale_timestamp"},           // too far ahead
		{"s1", 8, ms(time.Second), time.Second, ""},                         //
		{"s2", 1, 0, time.Second, "unknown_session"},                        // a new session without a ts
		{"s2", 1, ms(500 * time.Millisecond), time.Second, "stale_session"}, // not later than s1
		{"s2", 1, ms(2 * time.Second), 2 * time.Second, ""},                 // a restart
		{"s2", 2, 0, 2 * time.Second, ""},                                   //
		{"s1", 9, ms(3 * time.Second), 3 * time.Second, "stale_session"},    // retired for good
		{"s2", 1 << 40, 0, 3 * time.Second, ""},                             //
		{"s2", 1<<40 - 1, 0, 3 * time.Second, "replay"},                     //
		// The sender's clock stepped back 9 s across a restart: s3 is
		// refused until its ts passes s2's (bounded by twice the window).
		{"s3", 1, ms(time.Second), 10 * time.Second, "stale_session"},
		{"s3", 1, ms(2*time.Second + time.Millisecond), 11 * time.Second, ""},
		{"s2", 1 << 41, ms(12 * time.Second), 12 * time.Second, "stale_session"},
		{"s1", 100, ms(12 * time.Second), 12 * time.Second, "stale_session"},
	}
	for i, s := range steps {
		assert.Equal(t, s.want, r.Check("golden-test:1", s.session, s.seq, s.ts, s.ts != 0, now.Add(s.at)), "step %d", i)
	}
	assert.Empty(t, r.Check("other:1", "s1", 1, ms(0), true, now), "state is per sender")
}

// FuzzDecode: any datagram decodes or is refused with a reason, never
// panics; a decoded one re-encodes to a datagram that decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, HeaderSize))
	if b, err := os.ReadFile(filepath.FromSlash(goldenPath)); err == nil {
		var gs []golden
		if json.Unmarshal(b, &gs) == nil {
			for _, g := range gs {
				d, _ := hex.DecodeString(g.Hex)
				f.Add(d)
			}
		}
	}
	key := []byte("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range [][]byte{key, nil} {
			p, err := Decode(b, k)
			if err != nil {
				if Reason(err) == "" {
					t.Fatal("an error without a reason")
				}
				continue
			}
			again, err := Encode(p.Header, p.Payload, k)
			if err != nil {
				t.Fatalf("re-encoding a decoded datagram: %v", err)
			}
			q, err := Decode(again, k)
			if err != nil || q.Type != p.Type || q.Sequence != p.Sequence || !bytes.Equal(q.Payload, p.Payload) {
				t.Fatalf("round trip changed the datagram: %v", err)
			}
			var anyv map[string]any
			_ = Unmarshal(p.Payload, &anyv) // must not panic
		}
	})
}
