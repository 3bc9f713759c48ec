package pgnotify_test

import (
	"testing"

	"github.com/heraldmq/herald/internal/pgtest"
)

// The multi-instance tests run whole instances (internal/server, through
// internal/server/servertest); the syncnet ones are in syncnet.

func TestMain(m *testing.M) { pgtest.Main(m) }
