package server

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/auth"
)

// authLeeway is the clock skew tolerated on a token's exp and nbf.
const authLeeway = 30 * time.Second

// newAuth builds the token verifier from the Auth* settings: an HMAC
// secret, a PEM public key, a JWKS URL (fetched now: Herald does not start
// without its keys; refreshed until ctx ends), or several of them.
func newAuth(ctx context.Context, cfg *Config, reg prometheus.Registerer, log zerolog.Logger) (*auth.Auth, error) {
	a := &auth.Auth{Secret: []byte(cfg.AuthSecret), Issuer: cfg.AuthIssuer, Audience: cfg.AuthAudience, Cookie: cfg.AuthCookie, Leeway: authLeeway}
	if cfg.AuthPublicKey != "" {
		b, err := os.ReadFile(cfg.AuthPublicKey) // #nosec G703 G304 -- the operator names the file
		if err != nil {
			return nil, fmt.Errorf("--auth-public-key: %w", err)
		}
		k, err := jwk.ParseKey(b, jwk.WithPEM(true))
		if err != nil {
			return nil, fmt.Errorf("--auth-public-key %s: not a PEM public key: %w", cfg.AuthPublicKey, err)
		}
		if pub, err := k.PublicKey(); err == nil {
			k = pub // a private key file verifies with its public half only
		}
		a.PublicKey = k
	}
	if cfg.AuthJWKSURL != "" {
		a.JWKS = &auth.JWKS{URL: cfg.AuthJWKSURL, Logger: log.With().Str("component", "jwks").Logger()}
		if err := reg.Register(a.JWKS); err != nil {
			return nil, err
		}
		if err := a.JWKS.Start(ctx); err != nil {
			return nil, fmt.Errorf("--auth-jwks-url %s: %w", cfg.AuthJWKSURL, err)
		}
	}
	return a, nil
}
