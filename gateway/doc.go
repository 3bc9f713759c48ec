// Package gateway is Herald's HTTP server: the v1 REST API of the reference
// server (push, pop, ack, lease, transaction, configure, delete, DLQ),
// /health, /metrics and the stats endpoint. It holds no queue logic: each
// handler checks its input, calls queue.Store and shapes the answer exactly as
// API.md says (field names, key order, status codes).
//
// # Concurrency
//
// Handlers run on net/http's goroutines. A waiting long-poll (wait=true)
// holds its request goroutine but no database connection: it re-pops when a
// local push wakes its queue (wakeBoard) or on a slow tick, until its timeout.
// The poller package will replace this with registered intentions.
//
// # Failures
//
// Bad input is answered 400 (413 for an oversized body) with
// {"error": "..."} and never reaches the database; per-item failures (a stale
// lease, an unknown message) are 200 with success:false, because clients
// retry 5xx. Only database faults give 500; they are logged at error level.
package gateway
