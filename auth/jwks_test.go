package auth_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
)

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

// Keys from a JWKS URL: rotation (old kid removed, new kid used) is picked
// up on the first token with the new kid; unknown kids fetch at most once
// per MinInterval; a failing or oversized fetch keeps the last good set,
// logged and counted; a set that cannot be fetched at start stops it.
func TestJWKS_RotationAndFailedFetches(t *testing.T) {
	k1, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	k2, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	srv := newJWKSServer(t)
	srv.serve(t, http.StatusOK, map[string]crypto.Signer{"k1": k1})
	j := &auth.JWKS{URL: srv.URL, MinInterval: 200 * time.Millisecond, Refresh: time.Hour}
	require.NoError(t, j.Start(t.Context()))
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(j))
	a := &auth.Auth{JWKS: j}
	now := time.Now()

	_, err = a.Verify(authtest.Sign(t, jwa.ES256(), k1, "k1", roleClaims("admin")), now)
	require.NoError(t, err)
	_, err = a.Verify(authtest.Sign(t, jwa.ES256(), k1, "", roleClaims("admin")), now)
	assert.Error(t, err, "a JWKS token must name its kid")

	// Rotation: k1 removed, k2 published.
	srv.serve(t, http.StatusOK, map[string]crypto.Signer{"k2": k2})
	// The new kid triggers a fetch, once MinInterval has passed since the
	// start's.
	require.Eventually(t, func() bool {
		_, err := a.Verify(authtest.Sign(t, jwa.RS256(), k2, "k2", roleClaims("admin")), now)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "the new kid triggers a fetch")
	_, err = a.Verify(authtest.Sign(t, jwa.ES256(), k1, "k1", roleClaims("admin")), now)
	assert.ErrorIs(t, err, auth.ErrUnknownKey, "the removed kid is refused")
	_, err = a.Verify(authtest.Sign(t, jwa.HS256(), []byte("k2"), "k2", roleClaims("admin")), now)
	assert.Error(t, err, "an HMAC token naming an RSA kid")

	// A flood of unknown kids fetches at most once per MinInterval.
	before := srv.fetches.Load()
	start := time.Now()
	for i := range 200 {
		_, err := a.Verify(authtest.Sign(t, jwa.RS256(), k2, fmt.Sprintf("nope-%d", i), roleClaims("admin")), now)
		assert.ErrorIs(t, err, auth.ErrUnknownKey)
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
			_, err := a.Verify(authtest.Sign(t, jwa.RS256(), k2, "unknown-"+name, roleClaims("admin")), now)
			assert.ErrorIs(t, err, auth.ErrUnknownKey, name)
			return srv.fetches.Load() > fetched
		}, 5*time.Second, 20*time.Millisecond, "%s: fetched", name)
		_, err = a.Verify(authtest.Sign(t, jwa.RS256(), k2, "k2", roleClaims("admin")), now)
		assert.NoError(t, err, "%s: the last good set still verifies", name)
	}
	assert.GreaterOrEqual(t, testutil.ToFloat64(jwksFetches(t, reg, "failed")), 5.0)
	assert.GreaterOrEqual(t, testutil.ToFloat64(jwksFetches(t, reg, "ok")), 2.0)

	// A JWKS that cannot be fetched at start stops the start.
	srv.serveRaw(http.StatusNotFound, nil)
	err = (&auth.JWKS{URL: srv.URL}).Start(t.Context())
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
