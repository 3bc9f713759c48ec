package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
)

// Role is what a token may do. Each role includes the ones below it.
type Role int

// Roles, from the least to the most allowed.
const (
	RoleNone      Role = iota
	RoleReadOnly       // reads: the DLQ (and a WebSocket connection, whose frames need more)
	RoleReadWrite      // push, pop, subscribe (WebSocket, SSE), ack, extend leases, configure, transactions
	RoleAdmin          // also delete queues and read internal stats and status
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

// Auth verifies JWT bearer tokens (RFC 7519) with github.com/lestrrat-go/jwx:
// signed with Secret (HS256, HS384, HS512), with PublicKey (RS256/384/512,
// PS256/384/512, ES256/384/512 by its curve, EdDSA) or with a key of the
// JWKS set its kid names. The algorithm is taken from the key, never from
// the token: "none", and a token that claims HMAC over a public key, fail.
// A token must carry a role claim; sub names the bearer; exp and nbf, when
// present, are enforced with Leeway; iss and aud when Issuer and Audience
// are set.
type Auth struct {
	Secret    []byte  // HMAC key; empty for none
	PublicKey jwk.Key // a public key (from a PEM file); nil for none
	JWKS      *JWKS   // keys published at a URL; nil for none
	Issuer    string  // when set, iss must equal it
	// Cookie, when set, names a cookie that may carry the token too (an
	// EventSource cannot set headers; a cookie keeps the token out of URLs).
	// A token in the cookie alone is honoured only as the cookie rule
	// allows (cookie.go): from the server's own origin or an allowed
	// one, and for a change only with the header X-Herald-CSRF.
	Cookie   string
	Audience string // when set, aud must contain it
	// Leeway tolerates clock skew on exp and nbf.
	Leeway time.Duration

	once   sync.Once
	static jwk.Set // Secret and PublicKey as keys with no kid
	err    error
}

// Claims are the parts of a verified token Herald uses.
type Claims struct {
	Subject string
	Role    Role
	Expires time.Time // zero when the token does not expire
	Rights  *Rights   // the herald claim; nil when absent (the role alone decides)
}

// Token errors; the gateway answers each 401.
var (
	ErrNoToken      = errors.New("a bearer token is required")
	ErrBadToken     = errors.New("the bearer token is not a valid JWT signed with a key Herald knows")
	ErrBadSignature = errors.New("the bearer token's signature does not match")
	ErrExpired      = errors.New("the bearer token has expired")
	ErrNotYetValid  = errors.New("the bearer token is not valid yet")
	ErrNoRole       = errors.New("the bearer token has no valid role claim (read-only, read-write or admin)")
	ErrBadIssuer    = errors.New("the bearer token's issuer or audience is not this server's")
	ErrUnknownKey   = errors.New("the bearer token names a key (kid) Herald does not know")
)

// maxTokenBytes bounds a token Herald parses.
const maxTokenBytes = 16 << 10

// staticKeys makes the keys of Secret and PublicKey, once.
func (a *Auth) staticKeys() (jwk.Set, error) {
	a.once.Do(func() {
		a.static = jwk.NewSet()
		if len(a.Secret) > 0 {
			k, err := jwk.Import(a.Secret)
			if err != nil {
				a.err = fmt.Errorf("auth secret: %w", err)
				return
			}
			a.err = a.static.AddKey(k)
		}
		if a.PublicKey != nil && a.err == nil {
			a.err = a.static.AddKey(a.PublicKey)
		}
	})
	return a.static, a.err
}

// keysFor picks the keys token is verified with: the JWKS key its kid
// names, or Secret and PublicKey. Only with a JWKS is the header read for
// its kid first (jwt.ParseString reads it again while verifying).
func (a *Auth) keysFor(token string) (set jwk.Set, requireKid bool, err error) {
	if a.JWKS != nil {
		msg, err := jws.ParseString(token)
		if err != nil || len(msg.Signatures()) != 1 {
			return nil, false, ErrBadToken
		}
		if kid, _ := msg.Signatures()[0].ProtectedHeaders().KeyID(); kid != "" {
			set, err := a.JWKS.keysFor(kid)
			return set, true, err
		}
	}
	set, err = a.staticKeys()
	return set, false, err
}

// Verify checks a compact JWT and returns its claims.
func (a *Auth) Verify(token string, now time.Time) (Claims, error) {
	if len(token) > maxTokenBytes || strings.Count(token, ".") != 2 {
		return Claims{}, ErrBadToken
	}
	set, requireKid, err := a.keysFor(token)
	if err != nil {
		return Claims{}, err
	}
	opts := []jwt.ParseOption{
		jwt.WithKeySet(set, jws.WithInferAlgorithmFromKey(true), jws.WithRequireKid(requireKid)),
		jwt.WithAcceptableSkew(a.Leeway),
		jwt.WithClock(jwt.ClockFunc(func() time.Time { return now })),
	}
	if a.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(a.Issuer))
	}
	if a.Audience != "" {
		opts = append(opts, jwt.WithAudience(a.Audience))
	}
	t, err := jwt.ParseString(token, opts...)
	switch {
	case err == nil:
	case errors.Is(err, jwt.TokenExpiredError()):
		return Claims{}, ErrExpired
	case errors.Is(err, jwt.TokenNotYetValidError()):
		return Claims{}, ErrNotYetValid
	case errors.Is(err, jwt.InvalidIssuerError()), errors.Is(err, jwt.InvalidAudienceError()):
		return Claims{}, ErrBadIssuer
	case errors.Is(err, jws.VerifyError()):
		return Claims{}, ErrBadSignature
	default:
		return Claims{}, ErrBadToken
	}
	var c Claims
	c.Subject, _ = t.Subject()
	if exp, ok := t.Expiration(); ok {
		c.Expires = exp
	}
	var herald any
	if t.Get("herald", &herald) == nil {
		b, err := json.Marshal(herald)
		if err != nil {
			return Claims{}, ErrBadRights
		}
		if c.Rights, err = ParseRights(b); err != nil {
			return Claims{}, err
		}
	}
	var role string
	if t.Get("role", &role) != nil {
		return Claims{}, ErrNoRole
	}
	r, ok := ParseRole(role)
	if !ok {
		return Claims{}, ErrNoRole
	}
	c.Role = r
	return c, nil
}

// SignToken makes an HS256 JWT with sub, role and, unless ttl is zero, exp
// (a negative ttl makes an expired token). For operators' tooling (herald
// token) and tests; Herald itself only verifies.
func SignToken(secret []byte, sub, role string, ttl time.Duration) string {
	b := jwt.NewBuilder().Subject(sub).IssuedAt(time.Now()).Claim("role", role)
	if ttl != 0 {
		b = b.Expiration(time.Now().Add(ttl))
	}
	t, err := b.Build()
	if err != nil {
		panic(err) // only fixed, valid claims are set
	}
	out, err := jwt.Sign(t, jwt.WithKey(jwa.HS256(), secret))
	if err != nil {
		panic(err) // an HMAC key of any length signs
	}
	return string(out)
}

// Source is where a request's token came from (Bearer).
type Source int

// Sources.
const (
	FromNone Source = iota
	FromHeader
	FromQuery
	FromCookie
)

// Bearer finds the token and where it came from: the Authorization
// header, the access_token query parameter (EventSource and browser
// WebSockets cannot set headers), or the cookie named cookie when it is
// set. Only the cookie comes with requests the user's page did not make
// (the cookie rule, cookie.go).
func Bearer(r *http.Request, cookie string) (string, Source) {
	if h := r.Header.Get("Authorization"); h != "" {
		if scheme, tok, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok), FromHeader
		}
		return "", FromNone
	}
	if t := r.URL.Query().Get("access_token"); t != "" {
		return t, FromQuery
	}
	if cookie == "" {
		return "", FromNone
	}
	if c, err := r.Cookie(cookie); err == nil && c.Value != "" {
		return c.Value, FromCookie
	}
	return "", FromNone
}

type claimsKey struct{}

// WithClaims returns ctx carrying a request's verified claims.
func WithClaims(ctx context.Context, c Claims) context.Context {
	return context.WithValue(ctx, claimsKey{}, c)
}

// ClaimsFrom returns the verified claims ctx carries; ok is false when it
// carries none (auth is off).
func ClaimsFrom(ctx context.Context) (Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(Claims)
	return c, ok
}

// RightsFrom returns the rights of the token ctx carries: nil with auth
// off or a token without the herald claim.
func RightsFrom(ctx context.Context) *Rights {
	if c, ok := ClaimsFrom(ctx); ok {
		return c.Rights
	}
	return nil
}

// ErrForbidden is what every refusal of a verified token wraps (403): a
// role too low (RoleError), the cookie rule (cookie.go).
var ErrForbidden = errors.New("forbidden")

// RoleError is a token whose role is below what the request needs.
type RoleError struct{ Have, Need Role }

func (e RoleError) Error() string {
	return "role " + e.Have.String() + " may not do this; it needs " + e.Need.String()
}

// Unwrap makes a RoleError an ErrForbidden.
func (e RoleError) Unwrap() error { return ErrForbidden }
