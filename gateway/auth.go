package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Role is what a token may do. Each role includes the ones below it.
type Role int

// Roles, from the least to the most allowed.
const (
	RoleNone      Role = iota
	RoleReadOnly       // consume: pop, subscribe (WebSocket, SSE), ack, renew, read the DLQ
	RoleReadWrite      // also produce: push, transactions
	RoleAdmin          // also configure and delete queues, read internal stats
)

// ParseRole reads a role claim.
func ParseRole(s string) (Role, bool) {
	switch s {
	case "read-only":
		return RoleReadOnly, true
	case "read-write":
		return RoleReadWrite, true
	case "admin":
		return RoleAdmin, true
	}
	return RoleNone, false
}

func (r Role) String() string {
	switch r {
	case RoleReadOnly:
		return "read-only"
	case RoleReadWrite:
		return "read-write"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// Auth checks HS256 JWT bearer tokens (RFC 7519) signed with Secret. A token
// must carry a role claim; sub names the producer; exp and nbf, when
// present, are enforced.
type Auth struct {
	Secret []byte
	// Leeway tolerates clock skew on exp and nbf.
	Leeway time.Duration
}

// Claims are the parts of a verified token Herald uses.
type Claims struct {
	Subject string
	Role    Role
	Expires time.Time // zero when the token does not expire
}

// Token errors; each answers 401.
var (
	ErrNoToken      = errors.New("a bearer token is required")
	ErrBadToken     = errors.New("the bearer token is not a valid HS256 JWT")
	ErrBadSignature = errors.New("the bearer token's signature does not match")
	ErrExpired      = errors.New("the bearer token has expired")
	ErrNotYetValid  = errors.New("the bearer token is not valid yet")
	ErrNoRole       = errors.New("the bearer token has no valid role claim (read-only, read-write or admin)")
)

var b64 = base64.RawURLEncoding

// Verify checks a compact JWT and returns its claims.
func (a *Auth) Verify(token string, now time.Time) (Claims, error) {
	h, rest, ok1 := strings.Cut(token, ".")
	p, sig, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(sig, ".") {
		return Claims{}, ErrBadToken
	}
	var header struct {
		Alg string `json:"alg"`
	}
	hb, err := b64.DecodeString(h)
	if err != nil || json.Unmarshal(hb, &header) != nil || header.Alg != "HS256" {
		return Claims{}, ErrBadToken // alg "none" and asymmetric algorithms are refused here
	}
	got, err := b64.DecodeString(sig)
	if err != nil {
		return Claims{}, ErrBadToken
	}
	mac := hmac.New(sha256.New, a.Secret)
	mac.Write([]byte(token[:len(h)+1+len(p)]))
	if !hmac.Equal(got, mac.Sum(nil)) {
		return Claims{}, ErrBadSignature
	}
	var body struct {
		Sub  string   `json:"sub"`
		Role string   `json:"role"`
		Exp  *float64 `json:"exp"`
		Nbf  *float64 `json:"nbf"`
	}
	pb, err := b64.DecodeString(p)
	if err != nil || json.Unmarshal(pb, &body) != nil {
		return Claims{}, ErrBadToken
	}
	c := Claims{Subject: body.Sub}
	if body.Exp != nil {
		c.Expires = time.Unix(int64(*body.Exp), 0)
		if now.After(c.Expires.Add(a.Leeway)) {
			return Claims{}, ErrExpired
		}
	}
	if body.Nbf != nil && now.Add(a.Leeway).Before(time.Unix(int64(*body.Nbf), 0)) {
		return Claims{}, ErrNotYetValid
	}
	role, ok := ParseRole(body.Role)
	if !ok {
		return Claims{}, ErrNoRole
	}
	c.Role = role
	return c, nil
}

// SignToken makes an HS256 JWT with sub, role and, unless ttl is zero, exp
// (a negative ttl makes an expired token). For
// operators' tooling and tests; Herald itself only verifies.
func SignToken(secret []byte, sub, role string, ttl time.Duration) string {
	claims := map[string]any{"sub": sub, "role": role, "iat": time.Now().Unix()}
	if ttl != 0 {
		claims["exp"] = time.Now().Add(ttl).Unix()
	}
	pb, _ := json.Marshal(claims)
	s := b64.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + b64.EncodeToString(pb)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(s))
	return s + "." + b64.EncodeToString(mac.Sum(nil))
}

// bearer finds the token: the Authorization header, or the access_token
// query parameter (EventSource and browser WebSockets cannot set headers).
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if scheme, tok, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	return r.URL.Query().Get("access_token")
}

type claimsKey struct{}

// claimsOf returns the request's verified claims; ok is false when auth is
// off.
func claimsOf(ctx context.Context) (Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(Claims)
	return c, ok
}

// authorize checks the request's token against need. On failure it answers
// 401 (no or bad token) or 403 (role too low) and returns false; with auth
// off it lets everything through.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, need Role) (*http.Request, bool) {
	if s.cfg.Auth == nil || need == RoleNone {
		return r, true
	}
	c, err := s.checkToken(r, need)
	if err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, errForbidden) {
			status = http.StatusForbidden
		} else {
			w.Header().Set("WWW-Authenticate", `Bearer realm="herald"`)
		}
		writeError(w, status, err.Error())
		return r, false
	}
	return r.WithContext(context.WithValue(r.Context(), claimsKey{}, c)), true
}

var errForbidden = errors.New("forbidden")

type forbiddenError struct{ have, need Role }

func (e forbiddenError) Error() string {
	return "role " + e.have.String() + " may not do this; it needs " + e.need.String()
}
func (e forbiddenError) Unwrap() error { return errForbidden }

func (s *Server) checkToken(r *http.Request, need Role) (Claims, error) {
	tok := bearer(r)
	if tok == "" {
		s.metrics.authFailures.WithLabelValues("missing").Inc()
		return Claims{}, ErrNoToken
	}
	c, err := s.cfg.Auth.Verify(tok, time.Now())
	if err != nil {
		s.metrics.authFailures.WithLabelValues("invalid").Inc()
		return Claims{}, err
	}
	if c.Role < need {
		s.metrics.authFailures.WithLabelValues("forbidden").Inc()
		return c, forbiddenError{have: c.Role, need: need}
	}
	return c, nil
}
