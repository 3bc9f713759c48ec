// Package reliability is the chaos suite, built only with the
// reliability tag: three herald processes on one PostgreSQL, syncnet
// between them through proxies that drop 30% of the datagrams, producers
// and consumers on every transport (WebSocket, SSE, long-poll) in two
// consumer groups, and faults while they run: every minute an instance is
// killed with SIGKILL (no drain, no lease given back) and started again,
// then PostgreSQL is restarted; every 3 s a consumer drops its connection.
//
// At the end every message must have been acked exactly once per consumer
// group, in push order within each partition, or dead-lettered after its
// retries, with nothing left leased. One consumer is careless on purpose:
// around its work it sends acks outside its lease, acks naming
// no lease under a live one, stale acks with and without their old lease
// ids, and one failure four times in a batch; none may be accepted where it
// must be refused, or release a lease.
//
//	make chaos-short   # 20,000 messages (go test -tags reliability -run TestChaos ./reliability)
//	make chaos         # HERALD_CHAOS_N=1000000, hours
//
// The failover tests put the HA parts operators use around Herald
// (docs/failover.md): PgBouncer 1.18 in transaction mode in front of the
// test cluster (pgbouncer_test.go), and a two-node Patroni 3.0.2 cluster
// on etcd 3.4 whose leader host is killed or switched over under a
// numbered flow (patroni_test.go); ha_test.go holds what they share. They
// need the pgbouncer, patroni and etcd-server packages and run their
// daemons as the postgres OS user on loopback ports of their own.
//
//	make failover      # go test -tags reliability -run 'TestPatroni|TestPgBouncer' ./reliability
//
// The package has no code outside its tests; this file is its doc.
package reliability
