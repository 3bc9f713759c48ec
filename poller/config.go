package poller

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/queue"
)

// WakeMode says what wakes the poller besides its own safety sweep.
type WakeMode string

// Wake modes.
const (
	// WakePush: pushes, through this instance or another (syncnet,
	// NOTIFY, logical replication), wake the queues they touch at once, and
	// pushes through this instance hand off to waiting subscriptions; the
	// sweep is only a safety net.
	WakePush WakeMode = "push"
	// WakePoll: push wake-ups are ignored and only the adaptive sweep finds
	// new messages, as the reference server does; a benchmark baseline.
	WakePoll WakeMode = "poll"
)

// PresenceGraceDefault is how long after a queue's first consumer
// registers it is checked again (see Config.OnPresence): time for other
// instances to hear.
const PresenceGraceDefault = 50 * time.Millisecond

// Defaults of Config fields.
const (
	WorkersDefault            = 2
	SweepMinDefault           = 100 * time.Millisecond
	SweepMaxDefault           = 5 * time.Second
	PreflightTimeoutDefault   = 50 * time.Millisecond
	HeldNoteDefault           = 100 * time.Millisecond
	FollowIdleDefault         = time.Second
	MaxIntentionsPerPreflight = 200
	// queryTimeout bounds every statement of a cycle, so a stuck database
	// cannot stall a worker for good.
	queryTimeout = 10 * time.Second
)

// Config configures a Poller.
type Config struct {
	// Store runs the pre-flight and the pops. Required.
	Store *queue.Store
	// Workers is how many cycles run side by side; a queue always goes to
	// the same worker. Zero means WorkersDefault.
	Workers int
	// Mode: zero means WakePush.
	Mode WakeMode
	// NoHandOff keeps pushes from leasing to this poller's intentions in
	// their own transaction (queue.HandOff): every delivery then goes
	// through a poll cycle. WakePoll implies it.
	NoHandOff bool
	// SweepMin and SweepMax bound the adaptive safety sweep; zero means
	// SweepMinDefault and SweepMaxDefault.
	SweepMin, SweepMax time.Duration
	// PreflightTimeout: a pre-flight slower than this is logged (it is not
	// cancelled: an answer late is better than none). Zero means
	// PreflightTimeoutDefault.
	PreflightTimeout time.Duration
	// MaxIntentions caps what one pre-flight covers, counted in distinct
	// targets (queue or pattern, partition, group): intentions waiting on
	// the same target share its rows. More are split over several
	// pre-flights. Zero means MaxIntentionsPerPreflight.
	MaxIntentions int
	// HeldNote is how long a lease this instance takes keeps a push here
	// to its partition from being popped (Poller.heldHere), at most the
	// lease's time: every delivery notes its lease again, so a partition
	// kept flowing is covered, and a release this instance never heard of
	// (an ack on another instance) delays that partition's next push by
	// this at most. Zero means HeldNoteDefault.
	HeldNote time.Duration
	// FollowIdle is how long a stream's lease that follows its partition
	// (docs/design.md, "A partition that keeps flowing") stays with the
	// stream once all it covers is acked and no push here hands it more:
	// then it is given back, and the partition is any consumer's again.
	// Zero means FollowIdleDefault (1 s).
	FollowIdle time.Duration
	// OnPresence, when set, is told of every intention registered (true)
	// and withdrawn (false), by queue ("" for a namespace/task intention,
	// which may match any queue): syncnet announces which instances have
	// consumers. It is called with no poller lock held, on the goroutine
	// that registers, withdraws (cancel, a one-shot's delivery) or expires
	// the intention (a worker's), and must not block; an intention's
	// registration is told before its withdrawal.
	// It answers true when a registration is news to the other instances:
	// its queue is then checked again PresenceGrace later (and 4 and 20
	// times that), so a push elsewhere before the announcement arrived is
	// not missed.
	OnPresence func(queue string, present bool) (news bool)
	// PresenceGrace is how long after a registration that is news
	// (OnPresence) its queue is checked again: the time other instances
	// take to hear of it (it is checked at 4 and 20 times it too, for a
	// busy machine). Zero means PresenceGraceDefault (50 ms).
	PresenceGrace time.Duration
	// Hints, when set, shares lease hints with other instances (syncnet):
	// this poller tells it the leases it takes and gives back, and skips
	// a push wake-up's pop of a partition another live instance holds. Its
	// methods are called with no poller lock held and must not block.
	Hints LeaseHints
	// PromptSources are the wake-up sources from other instances that pass
	// each pushed partition on at once, by name (syncnet: its limiter holds
	// back only a partition's repeat within its 2 ms window, and names it
	// at the window's end). Their partition wake-ups leave nothing for
	// credit coming back to look for (AddCredit); any other source from
	// elsewhere (NOTIFY, merged per queue over its window) makes credit
	// look while it wakes the queue, and so does a prompt source's wake-up
	// of a whole queue (a merge of many partitions). Nil: none.
	PromptSources []string
	// Registerer receives the poller's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// LeaseHints are advisory news of other instances' leases (syncnet.Node
// is one). Nothing read from them decides correctness: a wrong hint costs a
// wasted pop or a later one, found by a timer or the sweep.
type LeaseHints interface {
	LeaseAcquired(queue, partition, partitionID, group string, expires time.Time)
	LeaseReleased(queue, partition, partitionID, group string)
	// LeasedElsewhere: a non-zero until means skip (partition, group) and
	// look again by then; audit means ignore the hint this time and report
	// the database's answer with HintAudited.
	LeasedElsewhere(partitionID, group string) (until time.Time, audit bool)
	HintAudited(right bool)
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Workers == 0 {
		c.Workers = WorkersDefault
	}
	if c.Mode == "" {
		c.Mode = WakePush
	}
	if c.SweepMin == 0 {
		c.SweepMin = SweepMinDefault
	}
	if c.SweepMax == 0 {
		c.SweepMax = SweepMaxDefault
	}
	if c.PreflightTimeout == 0 {
		c.PreflightTimeout = PreflightTimeoutDefault
	}
	if c.MaxIntentions == 0 {
		c.MaxIntentions = MaxIntentionsPerPreflight
	}
	if c.PresenceGrace == 0 {
		c.PresenceGrace = PresenceGraceDefault
	}
	if c.HeldNote == 0 {
		c.HeldNote = HeldNoteDefault
	}
	if c.FollowIdle == 0 {
		c.FollowIdle = FollowIdleDefault
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("poller: Config.Store is required")
	case c.Workers < 1 || c.Workers > 64:
		return errors.New("poller: Config.Workers must be between 1 and 64")
	case c.Mode != WakePush && c.Mode != WakePoll:
		return errors.New("poller: Config.Mode must be push or poll")
	case c.SweepMin <= 0 || c.SweepMax < c.SweepMin:
		return errors.New("poller: Config.SweepMin must be positive and at most Config.SweepMax")
	case c.PreflightTimeout <= 0:
		return errors.New("poller: Config.PreflightTimeout must be positive")
	case c.MaxIntentions < 1:
		return errors.New("poller: Config.MaxIntentions must be positive")
	case c.PresenceGrace <= 0:
		return errors.New("poller: Config.PresenceGrace must be positive")
	case c.HeldNote <= 0 || c.HeldNote > time.Hour:
		return errors.New("poller: Config.HeldNote must be positive and at most an hour")
	case c.FollowIdle <= 0 || c.FollowIdle > time.Hour:
		return errors.New("poller: Config.FollowIdle must be positive and at most an hour")
	}
	return nil
}
