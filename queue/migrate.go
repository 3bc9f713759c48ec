package queue

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one embedded schema step. Versions come from the file name
// prefix (0001_init.sql is version 1) and are applied in order, once.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name must be NNNN_name.sql", e.Name())
		}
		v, err := strconv.Atoi(prefix)
		if err != nil {
			return nil, fmt.Errorf("migration %q: parsing version: %w", e.Name(), err)
		}
		body, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("reading migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate applies every embedded migration not yet recorded in the current
// schema's herald_migrations table. It is idempotent and safe to run from
// several instances at once: a transaction-scoped advisory lock (keyed on the
// schema name) serialises them. It returns the versions it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	var applied []int
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The first schema of search_path holds the tables ("herald" unless
		// the database URL says otherwise); create it on first start. The
		// lock comes first: instances starting together would otherwise
		// race to create the schema, and all but one fail.
		var schema, first string
		if err := tx.QueryRow(ctx, `SELECT coalesce(current_schema(), ''),
			trim(both '"' from trim(split_part(current_setting('search_path'), ',', 1)))`).Scan(&schema, &first); err != nil {
			return fmt.Errorf("reading the current schema: %w", err)
		}
		target := schema
		if target == "" {
			target = first
		}
		if target == "" || target == "$user" {
			return errors.New("no schema to migrate into: set search_path in the database URL")
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('herald_migrate:' || $1))`, target); err != nil {
			return fmt.Errorf("taking migration lock: %w", err)
		}
		if schema == "" {
			if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{target}.Sanitize()); err != nil {
				return fmt.Errorf("creating schema %s: %w", target, err)
			}
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS herald_migrations (
			version integer PRIMARY KEY,
			name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("creating migrations table: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT version FROM herald_migrations`)
		if err != nil {
			return fmt.Errorf("listing applied migrations: %w", err)
		}
		done, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("listing applied migrations: %w", err)
		}
		have := make(map[int]bool, len(done))
		for _, v := range done {
			have[int(v)] = true
		}
		for _, m := range migs {
			if have[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("applying migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO herald_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("recording migration %s: %w", m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}
