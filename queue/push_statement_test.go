package queue

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The push sends the statement whose steps can matter for it: the
// hand-off's only with a reservation, those that read, renew or extend a
// stream's lease only with a reservation naming one (Extend), bumped's
// all-or-nothing guard only across partitions (one partition gone is
// bumped by neither form), and the parameters the statement names.
func TestPushPlan_SendsTheStatementItsStepsCanMatterFor(t *testing.T) {
	const guard = "(SELECT count(*) FROM partitions x WHERE x.id IN (SELECT partition_id FROM counts))"
	owner := func(bool) string { return "me" }
	for _, c := range []struct {
		name     string
		parts    []string
		reserved []Reservation
		op       string
		guarded  bool
		args     int
	}{
		{"OnePartitionNobodyReserved", []string{"a"}, nil, "push_insert_lean", false, 6},
		{"TwoPartitionsNobodyReserved", []string{"a", "b"}, nil, "push_insert_lean", true, 6},
		{"OnePartitionReserved", []string{"a"}, []Reservation{{PartitionID: "a"}}, "push_insert_lease", false, 15},
		{"TwoPartitionsReserved", []string{"a", "b"}, []Reservation{{PartitionID: "a"}}, "push_insert_lease", true, 15},
		{"OnePartitionReservedToExtend", []string{"a"}, []Reservation{{PartitionID: "a"}, {PartitionID: "a", Extend: "l"}},
			"push_insert", false, 15},
		{"TwoPartitionsReservedToExtend", []string{"a", "b"}, []Reservation{{PartitionID: "b", Extend: "l"}},
			"push_insert", true, 15},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &pushPlan{partIDs: c.parts, reserved: c.reserved}
			b := &pgx.Batch{}
			p.queue(b, owner)
			require.Len(t, b.QueuedQueries, 2)
			q := b.QueuedQueries[1]
			assert.True(t, strings.HasPrefix(q.SQL, "-- herald:"+c.op+"\n"), q.SQL)
			assert.Equal(t, c.guarded, strings.Contains(q.SQL, guard))
			assert.Len(t, q.Arguments, c.args)
		})
	}
}
