package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/internal/pgcluster"
	"github.com/heraldmq/herald/queue"
)

// database is the instance's PostgreSQL: a pool, migrated, over
// DatabaseURL or a private cluster.
type database struct {
	cluster *pgcluster.Cluster // nil with a DatabaseURL
	pool    *pgxpool.Pool
}

// openDatabase starts the private PostgreSQL when there is no URL, opens
// the pool and applies the migrations. On error what it started is
// released.
func openDatabase(ctx context.Context, c *Config, log zerolog.Logger) (_ *database, err error) {
	db := &database{}
	defer func() {
		if err != nil {
			err = errors.Join(err, db.close(log))
		}
	}()
	url := c.DatabaseURL
	if url == "" {
		dir, err := filepath.Abs(filepath.Join(c.DataDir, "postgres"))
		if err != nil {
			return nil, fmt.Errorf("resolving data dir: %w", err)
		}
		log.Info().Str("dir", dir).Msg("no database URL: starting a private PostgreSQL")
		db.cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: dir, Port: c.PGPort,
			Logger: log.With().Str("component", "pgcluster").Logger()})
		if err != nil {
			return nil, err
		}
		url = db.cluster.URL()
	}
	if db.pool, err = queue.NewPoolWith(ctx, url, queue.PoolOptions{MaxConns: int32(c.DBMaxConns), // #nosec G115 -- validated by cmd
		ConnectTimeout: c.DBConnectTimeout}); err != nil {
		return nil, err
	}
	if n := db.pool.Config().MaxConns; n < DBMinConns {
		// Chores (retention, hygiene) hold one connection for their lock
		// while they work on another: with one they would never run.
		return nil, fmt.Errorf("the database pool has %d connection; it needs at least %d connections (--db-max-conns, or pool_max_conns in the URL)",
			n, DBMinConns)
	}
	applied, err := queue.Migrate(ctx, db.pool)
	if err != nil {
		return nil, err
	}
	log.Info().Ints("applied", applied).Msg("database migrated")
	return db, nil
}

// close closes the pool and stops the private PostgreSQL unless another
// herald on the same data directory still uses it.
func (db *database) close(log zerolog.Logger) error {
	if db.pool != nil {
		db.pool.Close()
		db.pool = nil
	}
	if db.cluster == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stopped, err := db.cluster.Release(rctx)
	db.cluster = nil
	if err != nil {
		return fmt.Errorf("stopping private PostgreSQL: %w", err)
	}
	log.Info().Bool("stopped", stopped).Msg("private PostgreSQL released")
	return nil
}

// Migrate opens the database of c (starting the private PostgreSQL when
// there is no URL), applies the migrations and releases it: `herald
// migrate`.
func Migrate(ctx context.Context, c Config) error {
	c = c.WithDefaults()
	db, err := openDatabase(ctx, &c, c.Logger)
	if err != nil {
		return err
	}
	return db.close(c.Logger)
}
