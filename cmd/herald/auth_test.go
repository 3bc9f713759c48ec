package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth/authtest"
	"github.com/heraldmq/herald/internal/pgtest"
)

// Herald serve verifies tokens with a PEM public key and with a
// JWKS URL (an identity provider's keys), and enforces --auth-issuer.
func TestServe_WithPublicKeyAndJWKS(t *testing.T) {
	bin := buildHerald(t)
	pemKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pemKey.Public())
	require.NoError(t, err)
	pemFile := filepath.Join(t.TempDir(), "pub.pem")
	require.NoError(t, os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600))

	idpKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pub, err := jwk.Import(idpKey.Public())
	require.NoError(t, err)
	require.NoError(t, pub.Set(jwk.KeyIDKey, "idp-1"))
	set := jwk.NewSet()
	require.NoError(t, set.AddKey(pub))
	body, err := json.Marshal(set)
	require.NoError(t, err)
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer idp.Close()

	p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t), "--auth-public-key", pemFile,
		"--auth-jwks-url", idp.URL, "--auth-issuer", "https://id.example")
	token := func(alg jwa.SignatureAlgorithm, key any, kid, iss string) string {
		return authtest.Sign(t, alg, key, kid, map[string]any{"sub": "u", "iss": iss, "role": "read-write",
			"exp": time.Now().Add(time.Hour).Unix()})
	}
	push := func(tok string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, p.url+"api/v1/push",
			strings.NewReader(`{"items":[{"queue":"authq","payload":1}]}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res.StatusCode
	}
	assert.Equal(t, http.StatusCreated, push(token(jwa.PS256(), pemKey, "", "https://id.example")), "PEM key")
	assert.Equal(t, http.StatusCreated, push(token(jwa.ES256(), idpKey, "idp-1", "https://id.example")), "JWKS key")
	assert.Equal(t, http.StatusUnauthorized, push(token(jwa.ES256(), idpKey, "idp-1", "https://other.example")), "issuer")
	assert.Equal(t, http.StatusUnauthorized, push(token(jwa.ES256(), idpKey, "idp-2", "https://id.example")), "unknown kid")
	code, body2 := get(t, p.url+"metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body2, `herald_auth_jwks_fetches_total{result="ok"}`)
	require.NoError(t, p.stop(t, syscall.SIGTERM))
}
