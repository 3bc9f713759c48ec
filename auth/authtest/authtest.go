package authtest

import (
	"testing"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
)

// Secret is the HMAC key of the tests' tokens: 32 bytes, the least
// auth.Auth accepts.
var Secret = []byte("0123456789abcdef0123456789abcdef")

// Sign makes a token with the given claims, signed by key with alg, with
// kid in its header when not empty.
func Sign(t testing.TB, alg jwa.SignatureAlgorithm, key any, kid string, claims map[string]any) string {
	t.Helper()
	b := jwt.NewBuilder()
	for k, v := range claims {
		b = b.Claim(k, v)
	}
	tok, err := b.Build()
	if err != nil {
		t.Fatalf("building a token of %v: %v", claims, err)
	}
	var opts []jwt.Option
	if kid != "" {
		h := jws.NewHeaders()
		if err := h.Set(jws.KeyIDKey, kid); err != nil {
			t.Fatalf("setting the key id %q: %v", kid, err)
		}
		opts = append(opts, jws.WithProtectedHeaders(h))
	}
	out, err := jwt.Sign(tok, jwt.WithKey(alg, key, opts...))
	if err != nil {
		t.Fatalf("signing a token with %s: %v", alg, err)
	}
	return string(out)
}
