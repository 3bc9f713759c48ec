//go:build reliability

// Package reliability is the chaos suite (issue 8): three Herald processes
// and one PostgreSQL, producers and consumers on every transport, and
// faults while they run; at the end every message must have been acked
// exactly once per consumer group, in push order within each partition, or
// dead-lettered after its retries, with nothing left leased. One consumer is
// careless on purpose (issue 14): around its work it sends acks outside its
// lease, acks naming no lease under a live one, stale acks with and without
// their old lease ids, and one failure four times in a batch; none may be
// accepted where it must be refused, or release a lease.
//
//	go test -tags reliability -run Chaos ./reliability                      # short: 20,000 messages
//	HERALD_CHAOS_N=1000000 go test -tags reliability -timeout 3h ./reliability  # long (make chaos)
package reliability

import (
	"testing"

	"github.com/heraldmq/herald/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
