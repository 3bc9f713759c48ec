package server

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/internal/pgcluster"
)

// supervisor restarts the private PostgreSQL when it dies (see
// pgcluster.Cluster.Supervise: back-off from 0.2 s doubling to 5 s, five
// failed attempts in a row and herald exits with an error, so that its own
// supervisor acts). A nil *supervisor (herald on --database-url) does
// nothing: that database's availability is its operator's business.
type supervisor struct {
	cluster *pgcluster.Cluster
	failed  chan error // receives Supervise's error when it gives up
	cancel  context.CancelFunc
	done    chan struct{}
}

// supervise starts watching cluster; nil cluster, nil supervisor. After a
// restart the pool's connections, all broken, are dropped at once, so that
// requests do not each find one of them dead.
func supervise(cluster *pgcluster.Cluster, pool *pgxpool.Pool, log zerolog.Logger) *supervisor {
	if cluster == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &supervisor{cluster: cluster, failed: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		err := cluster.Supervise(ctx, pgcluster.SuperviseConfig{OnRestart: pool.Reset})
		if err != nil {
			log.Error().Err(err).Msg("the private PostgreSQL stays down: herald exits")
			s.failed <- err
		}
	}()
	return s
}

// Failed delivers the error when supervision gave up (never for nil).
func (s *supervisor) Failed() <-chan error {
	if s == nil {
		return nil
	}
	return s.failed
}

// health is gateway.Config.Database: /health says "restarting" meanwhile.
func (s *supervisor) health() (restarting bool, restarts int) {
	h := s.cluster.Health()
	return h.Restarting, h.Restarts
}

// Stop ends supervision and waits for it, so that releasing the cluster
// afterwards is not undone by a restart.
func (s *supervisor) Stop() {
	if s == nil {
		return
	}
	s.cancel()
	<-s.done
}
