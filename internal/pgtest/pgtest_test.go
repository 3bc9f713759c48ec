package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m)
}

func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), pgtest.AdminURL(t))
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var exists bool
	err = conn.QueryRow(t.Context(),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists)
	require.NoError(t, err)
	return exists
}

func TestSchemasAreIsolated(t *testing.T) {
	var schemaA, schemaB string
	t.Run("a", func(t *testing.T) {
		pool := pgtest.Pool(t)
		_, err := pool.Exec(t.Context(), "CREATE TABLE widgets (id int); INSERT INTO widgets VALUES (1)")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_schema()").Scan(&schemaA))
		assert.Regexp(t, `^t_[0-9a-f]{16}$`, schemaA)
		var n int
		require.NoError(t, pool.QueryRow(t.Context(),
			"SELECT count(*) FROM "+pgx.Identifier{schemaA, "widgets"}.Sanitize()).Scan(&n))
		assert.Equal(t, 1, n, "unqualified CREATE TABLE did not land in the test schema")

		// b runs while a's schema and table still exist.
		t.Run("b", func(t *testing.T) {
			conn, err := pgx.Connect(t.Context(), pgtest.DSN(t))
			require.NoError(t, err)
			defer func() { _ = conn.Close(context.Background()) }()
			require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_schema()").Scan(&schemaB))
			assert.NotEqual(t, schemaA, schemaB)
			var visible bool
			require.NoError(t, conn.QueryRow(t.Context(), "SELECT to_regclass('widgets') IS NOT NULL").Scan(&visible))
			assert.False(t, visible, "a's table is visible in b")
			_, err = conn.Exec(t.Context(), "CREATE TABLE widgets (id int)")
			require.NoError(t, err, "b cannot create its own widgets")
		})
		assert.False(t, schemaExists(t, schemaB), "b's schema survived its cleanup")
		assert.True(t, schemaExists(t, schemaA), "a's schema dropped too early")
	})
	assert.False(t, schemaExists(t, schemaA), "a's schema survived its cleanup")
}

func TestParallelTestsGetOwnSchemas(t *testing.T) {
	// Parallel tests share the lazily started cluster.
	for _, name := range []string{"x", "y", "z"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			_, err := pool.Exec(t.Context(), "CREATE TABLE only_mine (name text)")
			require.NoError(t, err)
			_, err = pool.Exec(t.Context(), "INSERT INTO only_mine VALUES ($1)", name)
			require.NoError(t, err)
			rows, err := pool.Query(t.Context(), "SELECT name FROM only_mine")
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			assert.Equal(t, []string{name}, got)
		})
	}
}
