package queuetest

import (
	"context"
	"testing"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
)

// NewStore returns a migrated Store on a fresh schema, made as the server
// makes it (queue.NewPool: generic plans, statement counter; a queue config
// cache). The pool closes when the test ends. The package's TestMain must
// call pgtest.Main.
func NewStore(t testing.TB) *queue.Store {
	t.Helper()
	return NewStoreDSN(t, pgtest.DSN(t))
}

// NewStoreDSN is NewStore on dsn, a schema of pgtest.DSN (or a
// pgtest.Proxy in front of one).
func NewStoreDSN(t testing.TB, dsn string) *queue.Store {
	t.Helper()
	return NewStoreWith(t, dsn, nil)
}

// NewStoreWith is NewStoreDSN with the store's Config adjusted by adjust
// (nil: none) before queue.New, for a hook the test wires (OnGivenUp).
func NewStoreWith(t testing.TB, dsn string, adjust func(*queue.Config)) *queue.Store {
	t.Helper()
	ctx := context.Background()
	pool, err := queue.NewPool(ctx, dsn, 0)
	if err != nil {
		t.Fatalf("queuetest: %v", err)
	}
	t.Cleanup(pool.Close)
	if _, err := queue.Migrate(ctx, pool); err != nil {
		t.Fatalf("queuetest: %v", err)
	}
	cfg := queue.Config{Pool: pool, InstanceID: "test"}
	if adjust != nil {
		adjust(&cfg)
	}
	s, err := queue.New(cfg)
	if err != nil {
		t.Fatalf("queuetest: %v", err)
	}
	return s
}
