package queue_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The leases clients pop are owned by "<instance id>#pop": an instance id
// ending so would give back, at its start, the leases another instance's
// clients hold. It is refused, naming the field.
func TestConfig_InstanceIDEndingInThePopOwnerIsRefused(t *testing.T) {
	err := queue.Config{Pool: &pgxpool.Pool{}, InstanceID: "a#pop"}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Config.InstanceID")
	assert.NoError(t, queue.Config{Pool: &pgxpool.Pool{}, InstanceID: "a#popper"}.Validate())
}
