package queue

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Payload encryption at rest (AES-256-GCM). A queue configured with
// encryptionEnabled stores each payload as {"$herald_enc": base64(nonce ‖
// ciphertext), "v": 2} with a random 96-bit nonce per message; every read
// decrypts it, so consumers see the plaintext on every transport. The
// database keeps a key check value, so a wrong key is found at start-up.
//
// Format 2 binds the ciphertext to its message: the GCM additional data
// names the partition id, transaction id and message id, which a row keeps
// for its whole life, dead-lettered copies included. A ciphertext copied
// into another row (of any queue) then fails to decrypt instead of being
// delivered as that message. Format 1 (no "v"; additional data the constant
// sealAADv1) is still read, so rows written before keep working; they are
// not bound.

const sealedKey = "$herald_enc"

// sealVersion is the envelope format seal writes.
const sealVersion = 2

// sealAADv1 is format 1's additional data: the format only.
var sealAADv1 = []byte("herald payload v1")

// DecryptError is the dead-letter reason of a message whose payload failed
// to decrypt (tampered, copied from another row, or sealed by another key).
// Such a message is never delivered as data.
const DecryptError = "payload failed to decrypt"

// sealRef is what a format-2 ciphertext is bound to.
type sealRef struct{ partitionID, transactionID, messageID string }

// aad is the additional data of format 2: a label and the three ids, each
// length-prefixed so no two refs encode alike.
func (r sealRef) aad() []byte {
	const label = "herald payload v2"
	// Sized up front: one allocation per message sealed or opened.
	b := make([]byte, 0, len(label)+3*4+len(r.partitionID)+len(r.transactionID)+len(r.messageID))
	b = append(b, label...)
	for _, f := range [...]string{r.partitionID, r.transactionID, r.messageID} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f))) // #nosec G115 -- ids are at most 1024 bytes
		b = append(b, f...)
	}
	return b
}

type sealer struct {
	aead cipher.AEAD
	// failures counts payloads that failed to decrypt on delivery (kept
	// here: without a key nothing can fail).
	failures atomic.Uint64
}

func newSealer(key []byte) (*sealer, error) {
	if len(key) != 32 {
		return nil, errors.New("queue: the encryption key must be 32 bytes (64 hex characters)")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

// envelope is the stored form of a sealed payload.
type envelope struct {
	Sealed string `json:"$herald_enc"`
	V      int    `json:"v,omitempty"`
}

// seal returns the stored form of a JSON payload for the message ref.
func (s *sealer) seal(payload string, ref sealRef) (string, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("reading a nonce: %w", err)
	}
	ct := s.aead.Seal(nonce, nonce, []byte(payload), ref.aad())
	b, err := json.Marshal(envelope{Sealed: base64.StdEncoding.EncodeToString(ct), V: sealVersion})
	return string(b), err
}

// open returns the plaintext of a stored payload of the message ref, or the
// payload itself when it is not an envelope (or no key is configured). ok
// is false when it is an envelope that does not decrypt: the caller must
// not deliver it.
func (s *Store) open(stored string, ref sealRef) (plain string, ok bool) {
	if s.sealer == nil || !strings.Contains(stored, sealedKey) {
		return stored, true
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal([]byte(stored), &fields) != nil {
		return stored, true
	}
	// Only the exact envelope shape is one; any other object is a payload
	// that happens to use the key.
	_, sealed := fields[sealedKey]
	_, hasV := fields["v"]
	if !sealed || len(fields) > 2 || len(fields) == 2 && !hasV {
		return stored, true
	}
	// The fields are already split: decode the two, not the payload again
	// (this runs for every message delivered from an encrypted queue).
	var env envelope
	if json.Unmarshal(fields[sealedKey], &env.Sealed) != nil || hasV && json.Unmarshal(fields["v"], &env.V) != nil {
		return "", false
	}
	var aad []byte
	switch env.V {
	case 0:
		aad = sealAADv1
	case sealVersion:
		aad = ref.aad()
	default:
		return "", false
	}
	ct, err := base64.StdEncoding.DecodeString(env.Sealed)
	n := s.sealer.aead.NonceSize()
	if err != nil || len(ct) < n {
		return "", false
	}
	pt, err := s.sealer.aead.Open(nil, ct[:n], ct[n:], aad)
	if err != nil {
		return "", false
	}
	return string(pt), true
}

// DecryptFailures counts the messages whose payload failed to decrypt on
// delivery since the store started; each was dead-lettered instead of
// delivered (DecryptError).
func (s *Store) DecryptFailures() uint64 {
	if s.sealer == nil {
		return 0
	}
	return s.sealer.failures.Load()
}

// countDecryptFailures adds n to DecryptFailures.
func (s *Store) countDecryptFailures(n int) {
	if s.sealer != nil && n > 0 {
		s.sealer.failures.Add(uint64(n))
	}
}

// keyCheckValue identifies a key without revealing it.
func keyCheckValue(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("herald encryption key check"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// CheckEncryption verifies the configured key against the database's key
// check value (recording it on first use), and that no queue wants
// encryption while no key is configured. Run it at start-up, after Migrate.
func (s *Store) CheckEncryption(ctx context.Context) error {
	if s.sealer == nil {
		var names []string
		rows, err := s.pool.Query(ctx, `SELECT name FROM queues WHERE encryption_enabled ORDER BY name LIMIT 5`)
		if err != nil {
			return fmt.Errorf("checking encrypted queues: %w", err)
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("checking encrypted queues: %w", err)
		}
		if len(names) > 0 {
			return fmt.Errorf("queues %s have encryptionEnabled but no encryption key is set", strings.Join(names, ", "))
		}
		return nil
	}
	kcv := keyCheckValue(s.cfg.EncryptionKey)
	var stored string
	if err := s.pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO herald_settings (name, value) VALUES ('encryption_kcv', $1) ON CONFLICT (name) DO NOTHING RETURNING value
		) SELECT value FROM ins UNION ALL SELECT value FROM herald_settings WHERE name = 'encryption_kcv' LIMIT 1`, kcv).Scan(&stored); err != nil {
		return fmt.Errorf("checking the encryption key: %w", err)
	}
	if stored != kcv {
		return errors.New("the encryption key is not the one this database's payloads were encrypted with (key check value differs)")
	}
	return nil
}
