package gateway_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

// sign makes a token with the given claims, signed by key with alg, with
// kid in its header when not empty.
func sign(t *testing.T, alg jwa.SignatureAlgorithm, key any, kid string, claims map[string]any) string {
	t.Helper()
	b := jwt.NewBuilder()
	for k, v := range claims {
		b = b.Claim(k, v)
	}
	tok, err := b.Build()
	require.NoError(t, err)
	var opts []jwt.Option
	if kid != "" {
		h := jws.NewHeaders()
		require.NoError(t, h.Set(jws.KeyIDKey, kid))
		opts = append(opts, jws.WithProtectedHeaders(h))
	}
	out, err := jwt.Sign(tok, jwt.WithKey(alg, key, opts...))
	require.NoError(t, err)
	return string(out)
}

func roleClaims(role string) map[string]any {
	return map[string]any{"sub": "u1", "role": role, "exp": time.Now().Add(time.Hour).Unix()}
}

// publicJWK is the public half of a private key, as a PEM file gives it.
func publicJWK(t *testing.T, priv crypto.Signer) jwk.Key {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(priv.Public())
	require.NoError(t, err)
	k, err := jwk.ParseKey(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), jwk.WithPEM(true))
	require.NoError(t, err)
	return k
}

// The verifier is jwx; every algorithm Herald accepts verifies
// with its key; the algorithm comes from the key, never from the token.
func TestKeys_AlgorithmComesFromTheKey(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	now := time.Now()

	hs := &gateway.Auth{Secret: authSecret}
	for _, alg := range []jwa.SignatureAlgorithm{jwa.HS256(), jwa.HS384(), jwa.HS512()} {
		c, err := hs.Verify(sign(t, alg, authSecret, "", roleClaims("admin")), now)
		require.NoError(t, err, alg.String())
		assert.Equal(t, gateway.RoleAdmin, c.Role)
		assert.Equal(t, "u1", c.Subject)
	}

	for _, tc := range []struct {
		name string
		priv crypto.Signer
		algs []jwa.SignatureAlgorithm
	}{
		{"rsa", rsaKey, []jwa.SignatureAlgorithm{jwa.RS256(), jwa.PS256(), jwa.RS512()}},
		{"p256", p256, []jwa.SignatureAlgorithm{jwa.ES256()}},
		{"p384", p384, []jwa.SignatureAlgorithm{jwa.ES384()}},
		{"ed25519", edKey, []jwa.SignatureAlgorithm{jwa.EdDSA()}},
	} {
		a := &gateway.Auth{PublicKey: publicJWK(t, tc.priv)}
		for _, alg := range tc.algs {
			_, err := a.Verify(sign(t, alg, tc.priv, "", roleClaims("read-write")), now)
			assert.NoError(t, err, "%s %s", tc.name, alg)
		}
		_, err := a.Verify(sign(t, jwa.RS256(), other, "", roleClaims("admin")), now)
		assert.Error(t, err, "%s: a token of another key", tc.name)
		_, err = a.Verify(sign(t, jwa.HS256(), authSecret, "", roleClaims("admin")), now)
		assert.Error(t, err, "%s: an HMAC token where only a public key is configured", tc.name)
	}

	// HMAC with the public key's bytes as the secret: the classic
	// confusion (a verifier that takes alg from the token would accept it).
	der, err := x509.MarshalPKIXPublicKey(rsaKey.Public())
	require.NoError(t, err)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	pk := &gateway.Auth{PublicKey: publicJWK(t, rsaKey)}
	for _, secret := range [][]byte{pemBytes, der} {
		_, err := pk.Verify(handSigned(t, "HS256", secret, roleClaims("admin")), now)
		assert.Error(t, err, "HS256 over the public key")
	}
	// alg none, with and without a signature part; a header that lies.
	for _, alg := range []string{"none", "None", "NONE"} {
		tok := handSigned(t, alg, nil, roleClaims("admin"))
		_, err := hs.Verify(tok, now)
		assert.Error(t, err, alg)
		_, err = pk.Verify(tok, now)
		assert.Error(t, err, alg)
	}
	_, err = hs.Verify(handSigned(t, "RS256", authSecret, roleClaims("admin")), now)
	assert.Error(t, err, "an HMAC signature labelled RS256")
}

// handSigned builds a compact JWS by hand with any alg header: HMAC-SHA256
// over the signing input with secret, or no signature when secret is nil.
func handSigned(t *testing.T, alg string, secret []byte, claims map[string]any) string {
	t.Helper()
	h, err := json.Marshal(map[string]string{"alg": alg, "typ": "JWT"})
	require.NoError(t, err)
	p, err := json.Marshal(claims)
	require.NoError(t, err)
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	if secret == nil {
		return in + "."
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(in))
	return in + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// --auth-issuer and --auth-audience are enforced when set; the
// leeway tolerates clock skew on exp and nbf.
func TestKeys_IssuerAudienceLeeway(t *testing.T) {
	a := &gateway.Auth{Secret: authSecret, Issuer: "https://id.example", Audience: "herald", Leeway: 30 * time.Second}
	now := time.Now()
	good := map[string]any{"sub": "u", "role": "admin", "iss": "https://id.example", "aud": []string{"herald", "x"},
		"exp": now.Add(time.Hour).Unix()}
	_, err := a.Verify(sign(t, jwa.HS256(), authSecret, "", good), now)
	require.NoError(t, err)
	for name, change := range map[string]func(map[string]any){
		"issuer":      func(c map[string]any) { c["iss"] = "https://evil.example" },
		"no issuer":   func(c map[string]any) { delete(c, "iss") },
		"audience":    func(c map[string]any) { c["aud"] = "other" },
		"no audience": func(c map[string]any) { delete(c, "aud") },
	} {
		c := map[string]any{}
		for k, v := range good {
			c[k] = v
		}
		change(c)
		_, err := a.Verify(sign(t, jwa.HS256(), authSecret, "", c), now)
		assert.ErrorIs(t, err, gateway.ErrBadIssuer, name)
	}
	skew := map[string]any{"sub": "u", "role": "admin", "iss": "https://id.example", "aud": "herald"}
	skew["exp"] = now.Add(-20 * time.Second).Unix()
	_, err = a.Verify(sign(t, jwa.HS256(), authSecret, "", skew), now)
	assert.NoError(t, err, "expired 20 s ago, within the leeway")
	skew["exp"] = now.Add(-time.Minute).Unix()
	_, err = a.Verify(sign(t, jwa.HS256(), authSecret, "", skew), now)
	assert.ErrorIs(t, err, gateway.ErrExpired)
	delete(skew, "exp")
	skew["nbf"] = now.Add(time.Minute).Unix()
	_, err = a.Verify(sign(t, jwa.HS256(), authSecret, "", skew), now)
	assert.ErrorIs(t, err, gateway.ErrNotYetValid)
}

// jwksServer serves a key set that the test can change, and counts fetches.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	status  int
	fetches atomic.Int64
}

func newJWKSServer(t *testing.T) *jwksServer {
	s := &jwksServer{status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		w.WriteHeader(s.status)
		_, _ = w.Write(s.body)
	}))
	t.Cleanup(s.Close)
	return s
}

// serve publishes the public halves of keys under their kids.
func (s *jwksServer) serve(t *testing.T, status int, keys map[string]crypto.Signer) {
	t.Helper()
	set := jwk.NewSet()
	for kid, priv := range keys {
		k, err := jwk.Import(priv.Public())
		require.NoError(t, err)
		require.NoError(t, k.Set(jwk.KeyIDKey, kid))
		require.NoError(t, set.AddKey(k))
	}
	b, err := json.Marshal(set)
	require.NoError(t, err)
	s.mu.Lock()
	s.body, s.status = b, status
	s.mu.Unlock()
}

func (s *jwksServer) serveRaw(status int, body []byte) {
	s.mu.Lock()
	s.body, s.status = body, status
	s.mu.Unlock()
}

// Keys from a JWKS URL: rotation (old kid removed, new kid used)
// is picked up on the first token with the new kid; unknown kids fetch at
// most once per MinInterval; a failing or oversized fetch keeps the last
// good set, logged and counted.
func TestKeys_JWKSRotation(t *testing.T) {
	k1, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	k2, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	srv := newJWKSServer(t)
	srv.serve(t, http.StatusOK, map[string]crypto.Signer{"k1": k1})
	j := &gateway.JWKS{URL: srv.URL, MinInterval: 200 * time.Millisecond, Refresh: time.Hour}
	require.NoError(t, j.Start(t.Context()))
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(j))
	a := &gateway.Auth{JWKS: j}
	now := time.Now()

	_, err = a.Verify(sign(t, jwa.ES256(), k1, "k1", roleClaims("admin")), now)
	require.NoError(t, err)
	_, err = a.Verify(sign(t, jwa.ES256(), k1, "", roleClaims("admin")), now)
	assert.Error(t, err, "a JWKS token must name its kid")

	// Rotation: k1 removed, k2 published.
	srv.serve(t, http.StatusOK, map[string]crypto.Signer{"k2": k2})
	// The new kid triggers a fetch, once MinInterval has passed since the
	// start's.
	require.Eventually(t, func() bool {
		_, err := a.Verify(sign(t, jwa.RS256(), k2, "k2", roleClaims("admin")), now)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "the new kid triggers a fetch")
	_, err = a.Verify(sign(t, jwa.ES256(), k1, "k1", roleClaims("admin")), now)
	assert.ErrorIs(t, err, gateway.ErrUnknownKey, "the removed kid is refused")
	_, err = a.Verify(sign(t, jwa.HS256(), []byte("k2"), "k2", roleClaims("admin")), now)
	assert.Error(t, err, "an HMAC token naming an RSA kid")

	// A flood of unknown kids fetches at most once per MinInterval.
	before := srv.fetches.Load()
	start := time.Now()
	for i := range 200 {
		_, err := a.Verify(sign(t, jwa.RS256(), k2, fmt.Sprintf("nope-%d", i), roleClaims("admin")), now)
		assert.ErrorIs(t, err, gateway.ErrUnknownKey)
	}
	bound := int64(time.Since(start)/(200*time.Millisecond)) + 1
	assert.LessOrEqual(t, srv.fetches.Load()-before, bound, "fetches for 200 unknown kids")

	// Failures keep the last good set: an error status, garbage, a set too large.
	for name, bad := range map[string]func(){
		"500":     func() { srv.serveRaw(http.StatusInternalServerError, []byte("oops")) },
		"garbage": func() { srv.serveRaw(http.StatusOK, []byte("{not json")) },
		"no kid":  func() { srv.serveRaw(http.StatusOK, []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`)) },
		"oct key": func() { srv.serveRaw(http.StatusOK, []byte(`{"keys":[{"kty":"oct","kid":"sym","k":"c2VjcmV0"}]}`)) },
		"huge":    func() { srv.serveRaw(http.StatusOK, append([]byte(`{"keys":[],"x":"`), make([]byte, 2<<20)...)) },
	} {
		bad()
		// An unknown kid fetches the bad set (once MinInterval allows).
		fetched := srv.fetches.Load()
		require.Eventually(t, func() bool {
			_, err := a.Verify(sign(t, jwa.RS256(), k2, "unknown-"+name, roleClaims("admin")), now)
			assert.ErrorIs(t, err, gateway.ErrUnknownKey, name)
			return srv.fetches.Load() > fetched
		}, 5*time.Second, 20*time.Millisecond, "%s: fetched", name)
		_, err = a.Verify(sign(t, jwa.RS256(), k2, "k2", roleClaims("admin")), now)
		assert.NoError(t, err, "%s: the last good set still verifies", name)
	}
	assert.GreaterOrEqual(t, testutil.ToFloat64(jwksFetches(t, reg, "failed")), 5.0)
	assert.GreaterOrEqual(t, testutil.ToFloat64(jwksFetches(t, reg, "ok")), 2.0)

	// A JWKS that cannot be fetched at start stops the start.
	srv.serveRaw(http.StatusNotFound, nil)
	err = (&gateway.JWKS{URL: srv.URL}).Start(t.Context())
	assert.Error(t, err)
}

func jwksFetches(t *testing.T, reg *prometheus.Registry, result string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "herald_auth_jwks_fetches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"},
						func() float64 { return m.GetCounter().GetValue() })
				}
			}
		}
	}
	t.Fatalf("no herald_auth_jwks_fetches_total{result=%q}", result)
	return nil
}
