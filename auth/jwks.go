package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// JWKS is a set of verification keys published at a URL (an identity
// provider's jwks_uri), fetched at start, refreshed every Refresh, and
// again when a token names a kid the set lacks, at most once per
// MinInterval. A fetch that fails, or answers something that is not a key
// set within the bounds below, keeps the last good set; it is logged and
// counted (herald_auth_jwks_fetches_total{result}).
type JWKS struct {
	URL         string
	Refresh     time.Duration // zero means JWKSRefreshDefault
	MinInterval time.Duration // zero means JWKSMinIntervalDefault
	Client      *http.Client  // nil means a client with a 10 s timeout
	Logger      zerolog.Logger

	mu        sync.Mutex
	set       jwk.Set
	lastFetch time.Time
	fetches   *prometheus.CounterVec
}

// JWKS defaults and bounds.
const (
	JWKSRefreshDefault     = 15 * time.Minute
	JWKSMinIntervalDefault = 30 * time.Second
	jwksMaxBytes           = 1 << 20 // a key set larger than this is refused
	jwksMaxKeys            = 100     // and one with more keys
)

// Describe and Collect make the fetch counter a prometheus.Collector.
func (j *JWKS) Describe(ch chan<- *prometheus.Desc) { j.counter().Describe(ch) }

// Collect implements prometheus.Collector.
func (j *JWKS) Collect(ch chan<- prometheus.Metric) { j.counter().Collect(ch) }

func (j *JWKS) counter() *prometheus.CounterVec {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fetches == nil {
		j.fetches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_auth_jwks_fetches_total",
			Help: "JWKS fetches, by result (ok, failed)."}, []string{"result"})
	}
	return j.fetches
}

// Start fetches the set once (an error when it cannot: Herald does not start
// without keys) and refreshes it every Refresh until ctx ends.
func (j *JWKS) Start(ctx context.Context) error {
	if err := j.fetch(ctx); err != nil {
		return err
	}
	every := j.Refresh
	if every <= 0 {
		every = JWKSRefreshDefault
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = j.fetch(ctx) // logged and counted; the last good set stays
			}
		}
	}()
	return nil
}

// keysFor returns the set, fetched again first when it lacks kid and the
// last fetch is older than MinInterval.
func (j *JWKS) keysFor(kid string) (jwk.Set, error) {
	j.mu.Lock()
	set, last := j.set, j.lastFetch
	j.mu.Unlock()
	if set != nil {
		if _, ok := set.LookupKeyID(kid); ok {
			return set, nil
		}
	}
	minInterval := j.MinInterval
	if minInterval <= 0 {
		minInterval = JWKSMinIntervalDefault
	}
	if time.Since(last) >= minInterval {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = j.fetch(ctx)
		j.mu.Lock()
		set = j.set
		j.mu.Unlock()
	}
	if set == nil {
		return nil, ErrUnknownKey
	}
	if _, ok := set.LookupKeyID(kid); !ok {
		return nil, ErrUnknownKey
	}
	return set, nil
}

// fetch reads the set from URL and, when it is a valid one, keeps it.
func (j *JWKS) fetch(ctx context.Context) error {
	c := j.counter()
	j.mu.Lock()
	j.lastFetch = time.Now() // failures count against MinInterval too
	j.mu.Unlock()
	set, err := j.get(ctx)
	if err != nil {
		c.WithLabelValues("failed").Inc()
		j.Logger.Warn().Err(err).Str("url", j.URL).Msg("fetching the JWKS failed; keeping the last good key set")
		return err
	}
	c.WithLabelValues("ok").Inc()
	j.mu.Lock()
	j.set = set
	j.mu.Unlock()
	return nil
}

func (j *JWKS) get(ctx context.Context) (jwk.Set, error) {
	client := j.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.URL, nil)
	if err != nil {
		return nil, err
	}
	res, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("JWKS answered %s", res.Status)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, jwksMaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > jwksMaxBytes {
		return nil, fmt.Errorf("JWKS larger than %d bytes", jwksMaxBytes)
	}
	set, err := jwk.Parse(body)
	if err != nil {
		return nil, fmt.Errorf("parsing JWKS: %w", err)
	}
	switch n := set.Len(); {
	case n == 0:
		return nil, errors.New("JWKS holds no key")
	case n > jwksMaxKeys:
		return nil, fmt.Errorf("JWKS holds %d keys, more than %d", n, jwksMaxKeys)
	}
	for i := range set.Len() {
		k, _ := set.Key(i)
		if _, ok := k.KeyID(); !ok {
			return nil, errors.New("JWKS has a key without kid")
		}
		// A key set is published: a symmetric key in it would let anyone
		// who reads it sign tokens.
		if k.KeyType() == jwa.OctetSeq() {
			return nil, errors.New("JWKS has a symmetric (oct) key: only public keys verify tokens from a JWKS")
		}
	}
	return set, nil
}
