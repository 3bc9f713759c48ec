package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// run starts s and returns a stop function that cancels it and returns
// Run's error.
func run(t *testing.T, s *Server) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("stopped while starting: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready within 10 s")
	}
	return func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30 s of its context ending")
			return nil
		}
	}
}

func testConfig(t *testing.T) Config {
	return Config{Addr: "127.0.0.1:0", DatabaseURL: pgtest.DSN(t), Registry: prometheus.NewRegistry()}
}

// An instance serves the API once Ready, and once its context ends it has
// stopped serving and closed its pool.
func TestServer_ServesAndStops(t *testing.T) {
	s, err := New(context.Background(), testConfig(t))
	require.NoError(t, err)
	stop := run(t, s)
	res, err := http.Post(s.URL()+"/api/v1/push", "application/json",
		strings.NewReader(`{"items":[{"queue":"srv","payload":{"n":1}}]}`))
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	res, err = http.Get(s.URL() + "/api/v1/pop/queue/srv?autoAck=true")
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "%s", body)
	assert.Contains(t, string(body), `"n":1`)

	require.NoError(t, stop())
	assert.Error(t, s.Store().Ping(context.Background()), "the pool is closed")
	_, err = net.DialTimeout("tcp", s.Addr().String(), time.Second)
	assert.Error(t, err, "the port is closed")
	assert.NoError(t, s.Close(), "a second Close does nothing")
}

// A loop that fails stops the whole instance, in order, and Run says
// which loop.
func TestServer_FailingLoopStopsTheInstance(t *testing.T) {
	s, err := New(context.Background(), testConfig(t))
	require.NoError(t, err)
	fail := make(chan struct{})
	s.runners = append(s.runners, runner{"boom loop", func(ctx context.Context) error {
		select {
		case <-fail:
			return errors.New("it broke")
		case <-ctx.Done():
			return nil
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready within 10 s")
	}
	close(fail)
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "boom loop: it broke")
	case <-time.After(30 * time.Second):
		t.Fatal("a failed loop did not stop the instance")
	}
	assert.Error(t, s.Store().Ping(context.Background()), "the pool is closed")
}

// freeUDP is a loopback UDP address free right now.
func freeUDP(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := c.LocalAddr().String()
	require.NoError(t, c.Close())
	return addr
}

// New gives back what it took when a later step fails: here the auth key
// file is missing, after the database was opened and migrated and the
// syncnet socket bound.
func TestServer_NewReleasesOnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := testConfig(t)
	cfg.Listener, cfg.AuthPublicKey = ln, "/nonexistent/key.pem"
	cfg.Syncnet, cfg.SyncBind, cfg.SyncSecret = true, freeUDP(t), strings.Repeat("ab", 32)
	_, err = New(context.Background(), cfg)
	require.ErrorContains(t, err, "--auth-public-key")
	_, err = ln.Accept()
	assert.ErrorIs(t, err, net.ErrClosed, "the listener was closed")
	c, err := net.ListenPacket("udp", cfg.SyncBind)
	require.NoError(t, err, "the syncnet socket was closed")
	_ = c.Close()
}

// An instance built and closed without running gives back its syncnet
// socket and its push buffer (a file lock): the next one on the same
// address and directory starts.
func TestServer_CloseWithoutRun(t *testing.T) {
	cfg := testConfig(t)
	cfg.Syncnet, cfg.SyncBind, cfg.SyncSecret = true, freeUDP(t), strings.Repeat("ab", 32)
	cfg.BufferDir = t.TempDir()
	for range 2 {
		cfg.Registry = prometheus.NewRegistry()
		s, err := New(context.Background(), cfg)
		require.NoError(t, err)
		require.NoError(t, s.Close())
	}
	cfg.Registry = prometheus.NewRegistry()
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, run(t, s)())
}

// Every instance reads the maintenance switches every 30 s rather than
// every 5 s, whatever its wake mode: a NOTIFY (listening), a datagram
// (syncnet) and the members beat (every 2 s, which also reads when a
// switch last changed) tell it sooner; the periodic read only heals. At
// 5 s the read was a third of an idle instance's statements (issue 16,
// point 5), and the most frequent wake-up of an idle one after the beat.
func TestServer_MaintenanceRefreshIsLongInEveryWakeMode(t *testing.T) {
	for _, wake := range []string{WakeNotify, WakePoll, WakeLocal} {
		cfg := testConfig(t)
		cfg.Wake = wake
		got := time.Duration(-1)
		cfg.Adjust.Gateway = func(g *gateway.Config) { got = g.MaintenanceRefresh }
		s, err := New(context.Background(), cfg)
		require.NoError(t, err)
		require.NoError(t, s.Close())
		assert.Equal(t, gateway.MaintenanceRefreshListening, got, wake)
	}
}
