package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
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

// The store tells the gateway of what every pop gives up on or skips
// (queue.Config.OnGivenUp, wired as the store is built): a pop that skips a
// message past its queue's ttl is counted once in
// herald_messages_expired_total.
func TestServer_WhatAPopSkipsIsCountedInTheMetrics(t *testing.T) {
	cfg := testConfig(t)
	cfg.MetricsMaxQueues = 10 // the queue named in its label
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	stop := run(t, s)
	defer func() { require.NoError(t, stop()) }()
	call := func(method, path, body string) string {
		t.Helper()
		req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Less(t, res.StatusCode, 300, "%s %s: %s", method, path, b)
		return string(b)
	}
	call(http.MethodPost, "/api/v1/configure", `{"queue":"ttlq","options":{"ttl":60}}`)
	call(http.MethodPost, "/api/v1/push", `{"items":[{"queue":"ttlq","payload":"old"},{"queue":"ttlq","payload":"young"}]}`)
	_, err = s.Store().Pool().Exec(context.Background(), `UPDATE messages m
		SET created_at = m.created_at - interval '2 minutes' FROM partitions p, queues q
		WHERE p.id = m.partition_id AND q.id = p.queue_id AND q.name = 'ttlq' AND m.seq = 1`)
	require.NoError(t, err)
	assert.Contains(t, call(http.MethodGet, "/api/v1/pop/queue/ttlq?wait=false&batch=10", ""), `"young"`)
	assert.Contains(t, call(http.MethodGet, "/metrics", ""), "herald_messages_expired_total{queue=\"ttlq\"} 1\n")
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

// A pool of one connection, however it is asked for (the URL's
// pool_max_conns), is refused at start with a clear error: retention and
// hygiene hold one connection while they work on another, so with one
// they would never run.
func TestServer_RefusesADatabasePoolOfOneConnection(t *testing.T) {
	cfg := testConfig(t)
	u, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("pool_max_conns", "1")
	u.RawQuery = q.Encode()
	cfg.DatabaseURL = u.String()
	_, err = New(context.Background(), cfg)
	require.ErrorContains(t, err, "at least 2 connections")
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
// 5 s the read was a third of an idle instance's statements, and the
// most frequent wake-up of an idle one after the beat.
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

// A lease taken by an HTTP pop is the client's: it processes the message
// and acks it on any instance, whatever becomes of the one that answered
// the pop. A restart of that instance (same id) gives back the leases its
// streams held, not this one: the message is not delivered to anyone else
// meanwhile, and the client's ack still succeeds.
func TestStart_KeepsTheLeasesClientsPopped(t *testing.T) {
	// wait=false pops in the request; a long-poll through the poller's
	// coalesced pop (the path subscriptions share).
	for _, pop := range []string{"wait=false", "wait=true&timeout=5000"} {
		t.Run(pop, func(t *testing.T) { keepsThePoppedLease(t, pop) })
	}
}

func keepsThePoppedLease(t *testing.T, pop string) {
	cfg := testConfig(t)
	cfg.InstanceID = "popper"
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	stop := run(t, s)
	res, err := http.Post(s.URL()+"/api/v1/push", "application/json",
		strings.NewReader(`{"items":[{"queue":"held","payload":{"n":1}}]}`))
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	code, body := httpCall(t, http.MethodGet, s.URL()+"/api/v1/pop/queue/held?"+pop, "")
	require.Equal(t, http.StatusOK, code, body)
	var popped struct {
		Messages []struct {
			TransactionID string `json:"transactionId"`
			PartitionID   string `json:"partitionId"`
			LeaseID       string `json:"leaseId"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &popped), body)
	require.Len(t, popped.Messages, 1, body)
	m := popped.Messages[0]
	require.NotEmpty(t, m.LeaseID, body)
	require.NoError(t, stop())

	cfg.Registry = prometheus.NewRegistry()
	cfg.Listener = nil
	again, err := New(context.Background(), cfg)
	require.NoError(t, err)
	stopAgain := run(t, again)
	defer func() { assert.NoError(t, stopAgain()) }()
	code, body = httpCall(t, http.MethodGet, again.URL()+"/api/v1/pop/queue/held?wait=false", "")
	assert.Equal(t, http.StatusNoContent, code, "the popped message went to another consumer: %s", body)
	code, body = httpCall(t, http.MethodPost, again.URL()+"/api/v1/ack", `{"transactionId":"`+m.TransactionID+
		`","partitionId":"`+m.PartitionID+`","leaseId":"`+m.LeaseID+`","status":"completed"}`)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"success":true`)
}

// httpCall sends body (none when "") and returns the status and body.
func httpCall(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(b)
}
