package queue_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
)

// hungFirst is a multi-host URL whose first host is a proxy in front of
// the test database (to freeze: a hung primary) and whose second is the
// database itself, with both addresses.
func hungFirst(t *testing.T) (proxy *pgtest.Proxy, dsn, first, second string) {
	direct := pgtest.DSN(t)
	proxy, viaProxy := pgtest.NewProxy(t, direct)
	first, second = hostOf(t, viaProxy), hostOf(t, direct)
	dsn = strings.Replace(viaProxy, "@"+first+"/", "@"+first+","+second+"/", 1)
	require.NotEqual(t, viaProxy, dsn)
	return proxy, dsn, first, second
}

func hostOf(t *testing.T, dsn string) string {
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u.Host
}

// remoteOf is where a new connection of pool goes.
func remoteOf(ctx context.Context, t *testing.T, pool *pgxpool.Pool) string {
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	return c.Conn().PgConn().Conn().RemoteAddr().String()
}

// failOnHung runs n statements at once that outlive a short deadline on
// a hung server.
func failOnHung(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err := pool.Exec(sctx, "SELECT 1")
			assert.True(t, queue.IsUnavailable(err), "a statement on the hung host: %v", err)
		}()
	}
	wg.Wait()
}

// A hung first host of a multi-host URL (its kernel accepts connections,
// nothing answers: a SIGSTOPped primary) is left within seconds once
// statements on it time out: the pool's slots are not held by pgx's cancel
// requests to it (15 s each), and new connections go to the next host
// without waiting the connect timeout (5 s) on the hung one first.
func TestPool_AHungHostIsLeftForTheNextWithinSeconds(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	proxy, dsn, first, second := hungFirst(t)
	pool, err := queue.NewPoolWith(ctx, dsn, queue.PoolOptions{MaxConns: 2, ConnectTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer pool.Close()
	// Both slots hold connections to the first host.
	c1, err := pool.Acquire(ctx)
	require.NoError(t, err)
	c2, err := pool.Acquire(ctx)
	require.NoError(t, err)
	for _, c := range []*pgxpool.Conn{c1, c2} {
		assert.Equal(t, first, c.Conn().PgConn().Conn().RemoteAddr().String())
		c.Release()
	}

	proxy.Freeze()
	failOnHung(ctx, t, pool, 2)
	start := time.Now()
	var one int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))
	took := time.Since(start)
	t.Logf("a statement answered %v after those on the hung host timed out", took)
	assert.Less(t, took, 4500*time.Millisecond, "below the connect timeout (5 s) and pgx's cancel wait (15 s)")

	// Every new connection goes to the second host first now.
	pool.Reset()
	for range 2 {
		start = time.Now()
		assert.Equal(t, second, remoteOf(ctx, t, pool))
		assert.Less(t, time.Since(start), 2500*time.Millisecond, "no connect timeout on the hung host")
		pool.Reset()
	}
}

// With one host, a statement that times out on a hung server gives its
// pool slot back within seconds (pgx waits up to 15 s for the hung
// server to acknowledge the cancel request it sends), and once the server
// answers again the pool works.
func TestPool_AStatementEndedOnAHungHostFreesItsSlotWithinSeconds(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	pool, err := queue.NewPoolWith(ctx, dsn, queue.PoolOptions{MaxConns: 1})
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pool.Ping(ctx))

	proxy.Freeze()
	failOnHung(ctx, t, pool, 1)
	start := time.Now()
	require.Eventually(t, func() bool { return pool.Stat().TotalConns() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the connection's slot given back")
	took := time.Since(start)
	t.Logf("slot back %v after the statement timed out", took)
	assert.Less(t, took, 4*time.Second)

	proxy.Thaw()
	require.NoError(t, pool.Ping(ctx))
}

// A statement cancelled on a host that answers (a slow statement, a
// client that gave up) is not a hung host: the URL's order holds.
func TestPool_ACancelledStatementOnAHealthyHostKeepsTheHostOrder(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, dsn, first, _ := hungFirst(t)
	pool, err := queue.NewPoolWith(ctx, dsn, queue.PoolOptions{MaxConns: 2})
	require.NoError(t, err)
	defer pool.Close()
	assert.Equal(t, first, remoteOf(ctx, t, pool))

	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pool.Exec(sctx, "SELECT pg_sleep(10)")
	cancel()
	require.Error(t, err)
	// The cancel request is answered (at once) or given up on (after a
	// second or two): either way the pool lets the connection go.
	require.Eventually(t, func() bool { return pool.Stat().TotalConns() <= 1 }, 10*time.Second, 20*time.Millisecond)
	pool.Reset()
	assert.Equal(t, first, remoteOf(ctx, t, pool))
}
