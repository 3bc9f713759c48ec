package poller

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/queue"
)

// Wake-up sources (herald_wakeups_total{source}).
const (
	SourcePush     = "push"     // a push committed by this instance
	SourceAck      = "ack"      // an ack that released a lease or failed a message
	SourceRegister = "register" // a new intention
	SourceRelease  = "release"  // a lease given back by a consumer that left
)

// Poller serves intentions: it owns their registry and the workers that run
// the poll cycle (docs/design.md). Create it with New, run it with Run.
type Poller struct {
	cfg     Config
	store   *queue.Store
	log     zerolog.Logger
	metrics *metrics
	workers []*worker
	seq     atomic.Uint64
	nsKeys  atomic.Int64 // registered intentions with a namespace/task target
	paused  atomic.Bool  // pop maintenance: lease nothing (pause.go)
	orph    orphans      // lease ids of lost answers (orphans.go)
	leasing leasing      // the statements under way that lease (leasing.go)
	outage  queue.OutageLog
	held    *lru.Cache[hintKey, *heldNote] // leases this instance holds (heldHere)
	bg      background                     // goroutines started off the workers (a lost hand-off's read-back)
}

// New returns a Poller; nothing runs until Run.
func New(cfg Config) (*Poller, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	held, err := lru.New[hintKey, *heldNote](heldMax)
	if err != nil {
		return nil, fmt.Errorf("creating the held-lease cache: %w", err)
	}
	p := &Poller{cfg: cfg, store: cfg.Store, log: cfg.Logger.With().Str("component", "poller").Logger(), metrics: m,
		orph: orphans{ready: make(chan struct{}, 1)}, held: held}
	p.bg.ctx, p.bg.cancel = context.WithCancel(context.Background())
	p.outage.Log = p.log
	for i := range cfg.Workers {
		p.workers = append(p.workers, newWorker(p, i))
	}
	if cfg.Mode != WakePoll && !cfg.NoHandOff {
		cfg.Store.SetHandOff(p)
	}
	return p, nil
}

// Run runs the workers until ctx ends and returns when all have stopped,
// and with them every goroutine the poller started (background.stop).
// Intentions may be registered before Run; they are served once it starts.
func (p *Poller) Run(ctx context.Context) error {
	defer p.bg.stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.releaseOrphans(ctx)
	}()
	for _, w := range p.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// Mode reports the wake mode.
func (p *Poller) Mode() WakeMode { return p.cfg.Mode }

func (p *Poller) workerFor(key string) *worker {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return p.workers[h.Sum32()%uint32(len(p.workers))]
}

// Register adds an intention and returns the func that withdraws it. The
// intention's queue is checked at once. Safe for concurrent use.
func (p *Poller) Register(in *Intention) (cancel func()) {
	p.settle(in)
	if in.Target.Queue == "" {
		p.nsKeys.Add(1)
	}
	// Told before the intention is visible, so that its withdrawal (by a
	// delivery, its deadline or cancel) is always told after.
	news := false
	if f := p.cfg.OnPresence; f != nil {
		news = f(in.Target.Queue, true)
	}
	w := p.workerFor(in.key)
	w.mu.Lock()
	ks := w.keys[in.key]
	if ks == nil {
		ks = &keyState{}
		w.keys[in.key] = ks
	}
	ks.intentions = append(ks.intentions, in)
	// A target known to have nothing waiting but in the partitions hinted
	// since (keyState.known) still has: every other wake-up since would
	// have forgotten it (touch). With no hint the intention waits for a
	// wake-up or a push like those before it; with hints the fast path
	// serves it from them, in one batch (limited until then: a push's
	// hand-off would answer with its own partition's). Not in WakePoll
	// mode, which ignores wake-ups: there a new intention is checked on
	// arrival.
	known := p.cfg.Mode != WakePoll && !news && ks.trusts([2]string{in.Target.Partition, in.Target.Group})
	if !known {
		ks.touch()
		in.limited = !in.Standing // a push hands it nothing before its cycle looked (Intention.limited)
	} else if !in.Standing && ks.hinted(in.Target.Partition) {
		in.limited = true
	}
	w.mu.Unlock()
	if news {
		p.lookAgain(w, in.key)
	}
	p.metrics.intentions.Inc()
	p.metrics.woke(SourceRegister)
	w.signal()
	return func() {
		w.mu.Lock()
		for !in.Standing && in.serving > 0 {
			w.served.Wait() // a pop under way for it: what it takes is delivered first
		}
		ended := w.markGone(in)
		w.mu.Unlock()
		if ended {
			p.withdrawn(in)
		}
	}
}

// settle fills in what in leaves to defaults and gives it its key and
// place in arrival order.
func (p *Poller) settle(in *Intention) {
	if in.Batch <= 0 {
		in.Batch = 1
	}
	if in.Partitions <= 0 {
		in.Partitions = 1
	}
	if in.Target.Group == "" {
		in.Target.Group = queue.DefaultGroup // one spelling, so lease-safety checks compare equal
	}
	in.key = targetKey(in.Target)
	in.seq = p.seq.Add(1)
	if in.Target.Since.IsZero() {
		in.Target.Since = time.Now() // a "new" subscription starts at arrival
	}
	in.credit = in.Credit
	if in.credit <= 0 {
		in.credit = in.Batch
	}
}

// lookAgain looks at key again once the other instances know of a new
// consumer: they learn of it a moment from now, and a push they make
// meanwhile may not be announced to us. After PresenceGrace, and twice
// more (4 and 20 times it) for a busy machine, whose peers may hear later.
func (p *Poller) lookAgain(w *worker, key string) {
	for _, d := range []time.Duration{p.cfg.PresenceGrace, 4 * p.cfg.PresenceGrace, 20 * p.cfg.PresenceGrace} {
		time.AfterFunc(d, func() {
			w.mu.Lock()
			ks := w.keys[key]
			if ks != nil {
				ks.touch()
			}
			w.mu.Unlock()
			if ks != nil {
				w.signal()
			}
		})
	}
}

// withdrawn tells OnPresence of intentions that ended. Called with no lock
// held.
func (p *Poller) withdrawn(ins ...*Intention) {
	if f := p.cfg.OnPresence; f != nil {
		for _, in := range ins {
			f(in.Target.Queue, false)
		}
	}
}

// AddCredit lets a standing intention take n more messages (its consumer
// acknowledged some), or, with n = 0, says that it may take again after a
// Hold. Its queue is checked again when it had no credit, its last
// delivery took all it could, or a cycle passed it over meanwhile; an
// intention that drained what it took with credit to spare has missed
// nothing.
func (p *Poller) AddCredit(in *Intention, n int) {
	w := p.workerFor(in.key)
	w.mu.Lock()
	look := false
	if !in.gone {
		// With no credit it took nothing, and what changed meanwhile (a
		// lease that expired, say) marked nothing for it.
		starved := in.credit <= 0
		in.credit += n
		ks := w.keys[in.key]
		// Pushes on other instances may reach this one merged (NOTIFY: at
		// most one per queue per window): while they come, credit coming
		// back looks too, rather than wait for the merged wake-up at the
		// window's end. A prompt source's partition wake-ups
		// (Config.PromptSources) come as each push does: they leave
		// nothing to look for.
		pushedElsewhere := ks != nil && time.Since(ks.remoteAt) < remoteRecent
		if in.missed || starved || in.limited || pushedElsewhere || n == 0 {
			// Not ready yet (a cycle or a push holds its credit): the
			// holder looks when it lets go (lookIfMissed).
			in.missed = true
			look = w.lookIfMissed(in)
		}
	}
	w.mu.Unlock()
	if look {
		w.signal()
	}
}

// Wake says that queue may have work; partition, when known, names the one
// that changed, which lets the poller lease it without a pre-flight. It
// costs nothing when no intention waits on the queue. In WakePoll mode only
// SourceRegister is honoured; everything else is left to the sweep.
func (p *Poller) Wake(source, queueName, partition string) {
	p.metrics.woke(source)
	if p.cfg.Mode == WakePoll && source != SourceRegister {
		return
	}
	key := "q:" + queueName
	w := p.workerFor(key)
	w.mu.Lock()
	ks := w.keys[key]
	if ks != nil && remote(source) && (partition == "" || !slices.Contains(p.cfg.PromptSources, source)) {
		// A wake-up that may come late, merged with others (AddCredit).
		ks.remoteAt = time.Now()
	}
	waiting := ks != nil && slices.ContainsFunc(ks.intentions, func(in *Intention) bool { return !in.gone })
	switch {
	case ks == nil:
	case partition == "":
		ks.touch()
	default:
		// Only this partition changed: it can be served without a
		// pre-flight (worker.fastServe). Whether only this instance's
		// pushes said so: those alone may be passed over while a lease of
		// this instance holds the partition (heldHere). What the key
		// knows stays true: this news is in its hints (keyState.known).
		if ks.hints == nil {
			ks.hints = map[string]bool{}
		}
		onlyPushes, seen := ks.hints[partition]
		ks.hints[partition] = source == SourcePush && (onlyPushes || !seen)
		if !waiting && (seen || source != SourcePush) {
			// Not the own wake-up of a push that handed it off (the
			// first): news since (keyState.rehinted).
			if ks.rehinted == nil {
				ks.rehinted = map[string]bool{}
			}
			ks.rehinted[partition] = true
		}
	}
	// A key whose intentions are gone (lingering: keyState.lingers) keeps
	// a hint for the next one, which signals itself; one touched is ended
	// by the cycle.
	wake := ks != nil && (ks.dirty || waiting)
	w.mu.Unlock()
	if wake {
		w.signal()
	}
	// A namespace/task intention may match any queue: wake those too. They
	// are rare, and a pre-flight that finds nothing costs one query.
	if p.nsKeys.Load() > 0 {
		for _, w := range p.workers {
			if w.markNamespaceKeysDirty() {
				w.signal()
			}
		}
	}
}

// WakeAll marks every queue with waiting intentions: after a wake source
// (re)connects, anything may have changed while it was away. In WakePoll
// mode it is ignored like any other wake-up.
func (p *Poller) WakeAll(source string) {
	p.metrics.woke(source)
	if p.cfg.Mode == WakePoll {
		return
	}
	p.markAllDirty()
}

// markAllDirty marks every key of every worker dirty and signals the
// workers: each looks at all its queues in its next cycle.
func (p *Poller) markAllDirty() {
	for _, w := range p.workers {
		w.mu.Lock()
		for _, ks := range w.keys {
			ks.touch()
		}
		w.mu.Unlock()
		w.signal()
	}
}

// remoteRecent: how long after a wake-up from another instance that may
// have come merged a queue is treated as pushed to elsewhere (AddCredit).
const remoteRecent = 100 * time.Millisecond

// remote reports whether a wake-up source is another instance's push.
func remote(source string) bool {
	switch source {
	case SourcePush, SourceAck, SourceRegister, SourceRelease:
		return false
	}
	return true
}

// Wakeups reports the wake-ups received so far, by source
// (herald_wakeups_total).
func (p *Poller) Wakeups() map[string]uint64 {
	out := map[string]uint64{}
	p.metrics.wakeCounts.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

// Intentions reports how many intentions are registered.
func (p *Poller) Intentions() int {
	n := 0
	for _, w := range p.workers {
		w.mu.Lock()
		for _, ks := range w.keys {
			for _, in := range ks.intentions {
				if !in.gone {
					n++
				}
			}
		}
		w.mu.Unlock()
	}
	return n
}

// Start runs the poller in a goroutine until stop is called; stop waits for
// Run to return. For callers that manage no goroutines of their own (tests,
// simple wiring).
func (p *Poller) Start() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// Release gives a lease back at once, without counting an attempt, for a
// consumer that left before it processed msgs (the messages leased under
// it), and wakes their partitions: another consumer gets them now, not at
// lease expiry. An empty leaseID (autoAck) does nothing. The one place every
// transport gives leases back through.
func (p *Poller) Release(ctx context.Context, leaseID string, msgs []queue.Message) {
	if leaseID == "" {
		return
	}
	if err := p.store.ReleaseLease(context.WithoutCancel(ctx), leaseID); err != nil {
		// The releaser tries again while the database is away, and wakes
		// the queue once it is given back.
		p.orph.add(orphan{leaseID: leaseID, msgs: msgs})
		p.metrics.orphans.Inc()
		return
	}
	p.released(msgs)
}

// released wakes the partitions of msgs, whose lease was given back, here
// and (Config.Hints) on other instances.
func (p *Poller) released(msgs []queue.Message) {
	seen := map[string]bool{}
	for _, m := range msgs {
		if !seen[m.PartitionID] {
			seen[m.PartitionID] = true
			p.LeaseReleased(m.Queue, m.Partition, m.PartitionID, m.Group)
			p.Wake(SourceRelease, m.Queue, m.Partition)
		}
	}
}

// LeaseReleased says that a lease this instance held on (partition, group)
// ended: by an ack, or given back. It tells other instances (Config.Hints)
// and forgets the lease here: call it BEFORE the wake-up that follows the
// release, or a cycle between the two may pass the partition over as still
// held. A push here passed over while the lease was noted (heldHere) is
// woken by it: whatever path released the lease, and whether or not its
// caller wakes the partition (an ack that found it drained does not: that
// push committed after the ack looked and was woken before the release was
// told). An empty group is queue mode's.
func (p *Poller) LeaseReleased(queueName, partition, partitionID, group string) {
	if partitionID == "" {
		return
	}
	p.streamReleased(queueName, partitionID, group)
	k := hintKey{partitionID, groupName(group)}
	n, noted := p.held.Peek(k)
	p.held.Remove(k)
	p.answerReleased(queueName, k)
	if p.cfg.Hints != nil {
		p.cfg.Hints.LeaseReleased(queueName, partition, partitionID, groupName(group))
	}
	// After the note is forgotten: a push marked later was not passed over
	// (heldHere finds the note gone).
	if noted && n.passed.Load() {
		p.Wake(SourceRelease, queueName, partition)
	}
}

// answerReleased forgets a one-shot answer's lease its queue's key waited
// to hear released (keyState.leased).
func (p *Poller) answerReleased(queueName string, k hintKey) {
	key := "q:" + queueName
	w := p.workerFor(key)
	w.mu.Lock()
	if ks := w.keys[key]; ks != nil {
		delete(ks.leased, k)
	}
	w.mu.Unlock()
}

// heldNote is a lease this instance took, as heldHere sees it.
type heldNote struct {
	until time.Time // taken to hold until then (Config.HeldNote at most)
	// passed: a push here was passed over for it (LeaseReleased wakes its
	// partition).
	passed atomic.Bool
}

// heldMax bounds the leases heldHere remembers: past it the oldest are
// forgotten, which costs their partitions a pop that comes back empty.
const heldMax = 10000

// LeasesTaken notes the leases in res, taken by this instance: a push here
// to one of their partitions is not popped for Config.HeldNote or until
// released (heldHere), and other instances are told (Config.Hints). Call
// it before the messages are delivered, so that their ack's release
// (LeaseReleased) comes after it. A lease lasts the queue's lease time,
// read from the config cache; a miss assumes the default, which only
// bounds how long the hint lives.
func (p *Poller) LeasesTaken(res *queue.PopResult) {
	if res.LeaseID == "" {
		return
	}
	now := time.Now()
	seen := map[string]bool{}
	for _, m := range res.Messages {
		if seen[m.PartitionID] {
			continue
		}
		seen[m.PartitionID] = true
		lease, _ := p.leaseTime(m.Queue)
		until := now.Add(lease)
		p.held.Add(hintKey{m.PartitionID, groupName(m.Group)}, &heldNote{until: now.Add(min(p.cfg.HeldNote, until.Sub(now)))})
		if p.cfg.Hints != nil {
			p.cfg.Hints.LeaseAcquired(m.Queue, m.Partition, m.PartitionID, m.Group, until)
		}
	}
}

// leaseTime is how long a lease on queueName lasts, read from the config
// cache; a miss assumes the default (known false).
func (p *Poller) leaseTime(queueName string) (d time.Duration, known bool) {
	lease := queue.DefaultOptions().LeaseTime
	info, known := p.store.CachedConfig(queueName)
	if known {
		lease = info.Options.LeaseTime
	}
	return time.Duration(lease) * time.Second, known
}

// leaseExpiry is when the lease of res ends at the earliest (its queues'
// lease times from now); known is false when a queue's config is not
// cached.
func (p *Poller) leaseExpiry(res *queue.PopResult) (at time.Time, known bool) {
	now, known := time.Now(), true
	seen := map[string]bool{}
	for _, m := range res.Messages {
		if seen[m.Queue] {
			continue
		}
		seen[m.Queue] = true
		d, ok := p.leaseTime(m.Queue)
		known = known && ok
		if t := now.Add(d); at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return at, known
}

// heldHere reports until when a lease this instance took is taken to hold
// (partition, group), as LeasesTaken and LeaseReleased told it. A pop of
// it would come back empty, and the pre-flight after that say the same: a
// push here is not popped until then (worker.fastServe), when a cycle or
// the ack's wake-up looks. Advisory like the lease hints: a release this
// instance did not hear of (an ack on another instance) delays only this
// instance's own pushes, by Config.HeldNote at most. The caller passes the
// push over: the note is marked so (LeaseReleased).
func (p *Poller) heldHere(k hintKey) (time.Time, bool) {
	n, ok := p.held.Get(k)
	if !ok {
		return time.Time{}, false
	}
	if !time.Now().Before(n.until) {
		p.held.Remove(k)
		return time.Time{}, false
	}
	// Marked before it is looked up again: a LeaseReleased that forgot it
	// in between sees the mark, or this finds it gone and pops.
	n.passed.Store(true)
	if cur, ok := p.held.Peek(k); !ok || cur != n {
		return time.Time{}, false
	}
	return n.until, true
}
