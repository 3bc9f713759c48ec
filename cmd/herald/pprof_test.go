package main

import (
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --pprof-addr serves Go's profiles on a listener of its own, and stops.
func TestServePprof(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	stop, err := servePprof(addr, zerolog.Nop())
	require.NoError(t, err)
	res, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.NotEmpty(t, body, "the command line")
	stop()
	_, err = http.Get("http://" + addr + "/debug/pprof/cmdline") //nolint:bodyclose // it fails: nothing listens
	assert.Error(t, err, "stopped")

	_, err = servePprof(addr+"0000", zerolog.Nop())
	assert.Error(t, err, "a bad address is an error")
}
