//go:build reliability

package reliability

import (
	"testing"

	"github.com/heraldmq/herald/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
