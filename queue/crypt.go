package queue

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Payload encryption at rest (AES-256-GCM). A queue configured with
// encryptionEnabled stores each payload as {"$herald_enc": base64(nonce ‖
// ciphertext)} with a random 96-bit nonce per message; every read decrypts
// it, so consumers see the plaintext on every transport. The database
// keeps a key check value, so a wrong key is found at start-up.

const sealedKey = "$herald_enc"

// sealAAD binds ciphertexts to Herald's format version.
var sealAAD = []byte("herald payload v1")

type sealer struct{ aead cipher.AEAD }

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

// seal returns the stored form of a JSON payload.
func (s *sealer) seal(payload string) (string, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	ct := s.aead.Seal(nonce, nonce, []byte(payload), sealAAD)
	b, err := json.Marshal(map[string]string{sealedKey: base64.StdEncoding.EncodeToString(ct)})
	return string(b), err
}

// open returns the plaintext of a stored payload, or the payload itself
// when it is not sealed (or not by this key: it is then shown as stored).
func (s *Store) open(stored string) string {
	if s.sealer == nil || !strings.Contains(stored, sealedKey) {
		return stored
	}
	var env map[string]string
	if json.Unmarshal([]byte(stored), &env) != nil || len(env) != 1 {
		return stored
	}
	ct, err := base64.StdEncoding.DecodeString(env[sealedKey])
	n := s.sealer.aead.NonceSize()
	if err != nil || len(ct) < n {
		return stored
	}
	pt, err := s.sealer.aead.Open(nil, ct[:n], ct[n:], sealAAD)
	if err != nil {
		return stored
	}
	return string(pt)
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
