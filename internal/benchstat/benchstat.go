package benchstat

import (
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// Stamp is what a measured message carries: its push time and index, and
// P, padding to a payload size (empty unless the benchmark pads).
type Stamp struct {
	T int64  `json:"t"` // push time, unix ns
	I int    `json:"i"`
	P string `json:"p,omitempty"`
}

// Recorder collects push → receipt latencies, once per message index:
// a second receipt of an index counts as a duplicate, and the first
// indexes (warm-up) are counted but not sampled. Safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	seen    map[int]bool
	samples []time.Duration
	dups    int
	warm    int
	total   int
	all     chan struct{}
}

// NewRecorder expects total distinct messages (zero: a count not known
// ahead, All never closes), the indexes below warm being warm-up.
func NewRecorder(total, warm int) *Recorder {
	return &Recorder{seen: make(map[int]bool, total), warm: warm, total: total, all: make(chan struct{})}
}

// RecordJSON records the message whose payload is data (a Stamp in JSON),
// received at now; a payload that is not one is passed over.
func (r *Recorder) RecordJSON(data []byte, now time.Time) {
	var s Stamp
	if json.Unmarshal(data, &s) != nil {
		return
	}
	r.Record(s.I, s.T, now)
}

// Record records message i, pushed at sent (unix ns), received at now.
func (r *Recorder) Record(i int, sent int64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[i] {
		r.dups++
		return
	}
	r.seen[i] = true
	if i >= r.warm {
		r.samples = append(r.samples, now.Sub(time.Unix(0, sent)))
	}
	if len(r.seen) == r.total {
		close(r.all)
	}
}

// Total is the count of messages given to NewRecorder.
func (r *Recorder) Total() int { return r.total }

// All is closed once Total distinct messages have arrived.
func (r *Recorder) All() <-chan struct{} { return r.all }

// Count is how many distinct messages have arrived.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Latencies is what a Recorder holds at one moment.
type Latencies struct {
	Sorted     []time.Duration // the sampled latencies, shortest first
	Received   int             // distinct messages
	Duplicates int             // receipts of a message already received
}

// Latencies returns a copy of what r has recorded so far.
func (r *Recorder) Latencies() Latencies {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := slices.Clone(r.samples)
	slices.Sort(s)
	return Latencies{Sorted: s, Received: len(r.seen), Duplicates: r.dups}
}

// Ms is the p-th percentile (0 to 100) of l in milliseconds; 0 without
// samples.
func (l Latencies) Ms(p float64) float64 { return Ms(Percentile(l.Sorted, p)) }

// Percentile is the p-th percentile (0 to 100) of sorted, the sample at
// rank p/100·(n-1) rounded down; zero when sorted is empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)-1))
	return sorted[i]
}

// Ms is d in milliseconds, to the microsecond.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
