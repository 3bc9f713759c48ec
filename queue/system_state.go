package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Keys of the system_state table: the cluster-wide switches.
const (
	// StateMaintenance is push maintenance: pushes are buffered on each
	// instance's disk instead of written here.
	StateMaintenance = "maintenance_mode"
	// StatePopMaintenance is pop maintenance: pops answer empty and
	// subscriptions get nothing.
	StatePopMaintenance = "pop_maintenance_mode"
)

// StateNotifyPayload is the NOTIFY payload SetSystemFlag sends on the
// schema's Herald channel ("herald." + schema, pgnotify's): it starts with
// a control character, which no queue name holds, so a listener tells it
// from a wake-up (pgnotify.ListenerConfig.OnState) and an older one wakes
// a queue that does not exist.
const StateNotifyPayload = "\x02system_state"

// SystemState is the cluster-wide switches as stored.
type SystemState struct {
	Maintenance    bool // StateMaintenance
	PopMaintenance bool // StatePopMaintenance
	// UpdatedAt and UpdatedBy tell the last change of either (zero and ""
	// when neither was ever set).
	UpdatedAt time.Time
	UpdatedBy string
}

const systemStateSQL = `-- herald:system_state
SELECT coalesce(bool_or((value->>'enabled')::boolean) FILTER (WHERE key = 'maintenance_mode'), false),
       coalesce(bool_or((value->>'enabled')::boolean) FILTER (WHERE key = 'pop_maintenance_mode'), false),
       max(updated_at),
       coalesce((array_agg(updated_by ORDER BY updated_at DESC))[1], '')
FROM system_state WHERE key IN ('maintenance_mode', 'pop_maintenance_mode')`

// SystemState reads the cluster-wide switches.
func (s *Store) SystemState(ctx context.Context) (SystemState, error) {
	return readSystemState(ctx, s.pool)
}

func readSystemState(ctx context.Context, q querier) (SystemState, error) {
	var st SystemState
	var at *time.Time
	if err := q.QueryRow(ctx, systemStateSQL).Scan(&st.Maintenance, &st.PopMaintenance, &at, &st.UpdatedBy); err != nil {
		return SystemState{}, fmt.Errorf("reading the system state: %w", err)
	}
	if at != nil {
		st.UpdatedAt = *at
	}
	return st, nil
}

// SetSystemFlag turns one switch (StateMaintenance or
// StatePopMaintenance) on or off, records this instance as its writer, and
// NOTIFYs the schema's channel with StateNotifyPayload in the same
// transaction, so listening instances re-read it as soon as it commits. It
// returns the state after the change.
func (s *Store) SetSystemFlag(ctx context.Context, key string, enabled bool) (SystemState, error) {
	if key != StateMaintenance && key != StatePopMaintenance {
		return SystemState{}, inputErrorf("unknown system state key %q", key)
	}
	var st SystemState
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `-- herald:system_state_set
			INSERT INTO system_state (key, value, updated_at, updated_by)
			VALUES ($1, jsonb_build_object('enabled', $2::boolean), clock_timestamp(), $3)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at,
				updated_by = excluded.updated_by`, key, enabled, s.cfg.InstanceID); err != nil {
			return err
		}
		// Sent at commit; a notifying transaction's cluster-wide commit
		// lock does not matter for a switch an operator flips.
		if _, err := tx.Exec(ctx, `-- herald:system_state_notify
			SELECT pg_notify('herald.' || current_schema(), $1)`, StateNotifyPayload); err != nil {
			return err
		}
		var err error
		st, err = readSystemState(ctx, tx)
		return err
	})
	if err != nil {
		return SystemState{}, fmt.Errorf("setting %s: %w", key, err)
	}
	return st, nil
}
