package gateway_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
)

// TestSlowBody_IsCut: a POST whose body trickles in (one byte a
// second of a declared 1,000) is answered 408 and its connection closed at
// the body deadline, and counted; a normal push, a long-poll that waits
// past the deadline and an SSE stream open across it are not affected.
func TestSlowBody_IsCut(t *testing.T) {
	t.Parallel()
	const deadline = time.Second
	e := newEnv(t, func(c *gateway.Config) { c.BodyReadTimeout = deadline })
	before := e.scrape("herald_http_slow_body_total")

	conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	start := time.Now()
	_, err = io.WriteString(conn, "POST /api/v1/push HTTP/1.1\r\nHost: herald\r\nContent-Type: application/json\r\n"+
		"Content-Length: 1000\r\n\r\n{")
	require.NoError(t, err)
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() { // the slow client: one byte a second until the server hangs up
		defer close(trickled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-trickled })

	// The answer, then the end of the connection, within deadline + margin.
	require.NoError(t, conn.SetReadDeadline(start.Add(deadline+3*time.Second)))
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "no answer to the slow body within %v", deadline+3*time.Second)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, res.StatusCode, "%s", body)
	assert.Contains(t, string(body), "request body")
	// Closed: EOF, or a reset when the trickle's bytes were still unread
	// in the server's socket as it closed (the kernel answers them RST).
	_, err = br.ReadByte()
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), "the connection was not closed: %v", err)
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, deadline, "cut before the deadline")
	assert.Less(t, took, deadline+2*time.Second, "cut long after the deadline")
	assert.Equal(t, before+1, e.scrape("herald_http_slow_body_total"))

	// Requests without a body have no body deadline: an SSE stream and a
	// long-poll live past it.
	c := e.openSSE(t, "/api/v1/sse/queue/slowbody-sse", nil)
	lpStart := time.Now()
	r := e.get("/api/v1/pop/queue/slowbody-lp?wait=true&timeout=" + strconv.FormatInt((3*deadline).Milliseconds(), 10))
	assert.Equal(t, http.StatusNoContent, r.status, "%s", r)
	assert.GreaterOrEqual(t, time.Since(lpStart), 2*deadline, "the long-poll did not wait well past the body deadline")
	e.push("slowbody-sse", `"late"`)
	m, _ := c.next()
	assert.JSONEq(t, `"late"`, string(m.Data))

	// A normal push, and one whose body comes in two parts within the
	// deadline, are served.
	assert.Len(t, e.push("slowbody", `"quick"`), 1)
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, `{"items":[{"queue":"slowbody",`)
		<-time.After(deadline / 4) // the client's pace, not a wait for a result
		_, _ = io.WriteString(pw, `"payload":"paced"}]}`)
		_ = pw.Close()
	}()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, e.url+"/api/v1/push", pr)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	pres, err := e.client.Do(req)
	require.NoError(t, err)
	pbody, _ := io.ReadAll(pres.Body)
	_ = pres.Body.Close()
	assert.Equal(t, http.StatusCreated, pres.StatusCode, "%s", pbody)
	assert.True(t, strings.Contains(string(pbody), "slowbody"), "%s", pbody)
	assert.Equal(t, before+1, e.scrape("herald_http_slow_body_total"), "a served body was counted as slow")
}
