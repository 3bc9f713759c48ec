package pgnotify_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/pgnotify"
)

// seriesNames is what reg exposes.
func seriesNames(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	return names
}

func TestListener_RegistersItsSeriesOnceOnTheRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := pgnotify.ListenerConfig{URL: "postgres://127.0.0.1:1/none", Waker: &recordingWaker{}, Registerer: reg}
	_, err := pgnotify.NewListener(cfg)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"herald_listen_reconnects_total", "herald_notifications_received_total",
		"herald_notification_queue_usage"}, seriesNames(t, reg))

	_, err = pgnotify.NewListener(cfg)
	var dup prometheus.AlreadyRegisteredError
	assert.True(t, errors.As(err, &dup), "a second listener on the same registry is refused: %v", err)

	_, err = pgnotify.NewListener(pgnotify.ListenerConfig{URL: cfg.URL, Waker: cfg.Waker})
	assert.NoError(t, err, "without a Registerer nothing is registered")
}
