package auth_test

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
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
)

// authSecret is the HMAC key of the tests' tokens.
var authSecret = authtest.Secret

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

// Every algorithm Herald takes verifies with its key (HS256/384/512,
// RS256/512, PS256, ES256/384, EdDSA); the algorithm comes from the key,
// never from the token: "none", HMAC over a public key, and a header that
// lies are refused.
func TestVerify_AlgorithmComesFromTheKey(t *testing.T) {
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

	hs := &auth.Auth{Secret: authSecret}
	for _, alg := range []jwa.SignatureAlgorithm{jwa.HS256(), jwa.HS384(), jwa.HS512()} {
		c, err := hs.Verify(authtest.Sign(t, alg, authSecret, "", roleClaims("admin")), now)
		require.NoError(t, err, alg.String())
		assert.Equal(t, auth.RoleAdmin, c.Role)
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
		a := &auth.Auth{PublicKey: publicJWK(t, tc.priv)}
		for _, alg := range tc.algs {
			_, err := a.Verify(authtest.Sign(t, alg, tc.priv, "", roleClaims("read-write")), now)
			assert.NoError(t, err, "%s %s", tc.name, alg)
		}
		_, err := a.Verify(authtest.Sign(t, jwa.RS256(), other, "", roleClaims("admin")), now)
		assert.Error(t, err, "%s: a token of another key", tc.name)
		_, err = a.Verify(authtest.Sign(t, jwa.HS256(), authSecret, "", roleClaims("admin")), now)
		assert.Error(t, err, "%s: an HMAC token where only a public key is configured", tc.name)
	}

	// HMAC with the public key's bytes as the secret: the classic
	// confusion (a verifier that takes alg from the token would accept it).
	der, err := x509.MarshalPKIXPublicKey(rsaKey.Public())
	require.NoError(t, err)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	pk := &auth.Auth{PublicKey: publicJWK(t, rsaKey)}
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

// Issuer and Audience (--auth-issuer, --auth-audience) are enforced when
// set; Leeway tolerates clock skew on exp and nbf, and no more.
func TestVerify_IssuerAudienceAndLeeway(t *testing.T) {
	a := &auth.Auth{Secret: authSecret, Issuer: "https://id.example", Audience: "herald", Leeway: 30 * time.Second}
	now := time.Now()
	good := map[string]any{"sub": "u", "role": "admin", "iss": "https://id.example", "aud": []string{"herald", "x"},
		"exp": now.Add(time.Hour).Unix()}
	_, err := a.Verify(authtest.Sign(t, jwa.HS256(), authSecret, "", good), now)
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
		_, err := a.Verify(authtest.Sign(t, jwa.HS256(), authSecret, "", c), now)
		assert.ErrorIs(t, err, auth.ErrBadIssuer, name)
	}
	skew := map[string]any{"sub": "u", "role": "admin", "iss": "https://id.example", "aud": "herald"}
	skew["exp"] = now.Add(-20 * time.Second).Unix()
	_, err = a.Verify(authtest.Sign(t, jwa.HS256(), authSecret, "", skew), now)
	assert.NoError(t, err, "expired 20 s ago, within the leeway")
	skew["exp"] = now.Add(-time.Minute).Unix()
	_, err = a.Verify(authtest.Sign(t, jwa.HS256(), authSecret, "", skew), now)
	assert.ErrorIs(t, err, auth.ErrExpired)
	delete(skew, "exp")
	skew["nbf"] = now.Add(time.Minute).Unix()
	_, err = a.Verify(authtest.Sign(t, jwa.HS256(), authSecret, "", skew), now)
	assert.ErrorIs(t, err, auth.ErrNotYetValid)
}

// FuzzAuthVerify: any bearer token is verified or refused, never panics,
// and nothing but a correctly signed token passes.
func FuzzAuthVerify(f *testing.F) {
	secret := []byte("fuzz secret")
	f.Add(auth.SignToken(secret, "s", "admin", time.Hour))
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("")
	a := &auth.Auth{Secret: secret}
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := a.Verify(tok, time.Now())
		if err == nil && c.Role == auth.RoleNone {
			t.Fatal("a verified token has a role")
		}
	})
}
