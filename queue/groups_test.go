package queue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// pushHeldOpen runs the push SQL function for q in a transaction it leaves
// open (holding the partition's lock, its message not committed yet) and
// returns that transaction's commit.
func pushHeldOpen(t *testing.T, s *queue.Store, q string, n int) (commit func()) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `SELECT push($1, NULL, jsonb_build_object('n', $2::int), NULL)`, q, n)
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Commit(ctx)) }
}

// waitReturnedOrBlocked waits (10 s at most) until done is closed or a
// statement of the store's pool waits for a lock (on the push held open).
func waitReturnedOrBlocked(t *testing.T, s *queue.Store, done <-chan struct{}) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		var waiting bool
		require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the act neither returned nor waited for the push's lock within 10 s")
}

// A seek (or a group reset) that runs while a push to the partition is in
// flight: the push's statement read the group's row as ready (it had
// messages waiting) and left it alone, and the seek placed the row at the
// partition's last offset as its snapshot saw it, before the push's
// commit. The row must still be ready for the pushed message once both
// committed, so a waiting consumer is served at once, not after the
// hygiene loop's repair.
func TestSeek_WaitingConsumerIsServedAtOnce(t *testing.T) {
	for _, act := range []string{"SeekToEnd", "SeekToTime", "Reset"} {
		t.Run(act, func(t *testing.T) {
			s := newStore(t)
			q := "seek-race-" + strings.ToLower(act)
			const g = "g"
			_, err := s.Configure(ctxT(t), queue.ConfigureRequest{Queue: q})
			require.NoError(t, err)
			assert.Empty(t, pop(t, s, queue.PopRequest{Queue: q, Group: g}).Messages) // registers g
			push(t, s, q, "", nums(1, 2)...)
			if act == "Reset" {
				// g read both; a reset puts it back at its start.
				res := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 10})
				ackAll(t, s, res, queue.StatusCompleted)
				push(t, s, q, "", nums(3, 3)...)
			}
			commit := pushHeldOpen(t, s, q, 9)

			done := make(chan struct{})
			go func() {
				defer close(done)
				switch act {
				case "SeekToEnd":
					_, err = s.Seek(context.Background(), g, q, "", nil)
				case "SeekToTime":
					future := time.Now().Add(time.Hour)
					_, err = s.Seek(context.Background(), g, q, "", &future)
				case "Reset":
					_, err = s.DeleteGroup(context.Background(), g, q, false)
				}
			}()
			waitReturnedOrBlocked(t, s, done)
			commit()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the act did not return within 10 s of the push's commit")
			}
			require.NoError(t, err)

			want := []int{9}
			if act == "Reset" {
				want = []int{1, 2, 3, 9}
			}
			res := pop(t, s, queue.PopRequest{Queue: q, Group: g, Batch: 10})
			assert.Equal(t, want, payloads(t, res.Messages), "the message pushed while the group moved is served at once")
		})
	}
}
