package server

// The glue between the queue store's caches and syncnet: a queue's settings
// to and from QUEUE_CONFIG_SET, the node's callbacks into the store, and
// the caches' stats and metrics. Neither package knows the other; only the
// assembly does.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// hook sets the node's callbacks that keep the store's caches in step with
// other instances: deleted queues and partitions are forgotten, configured
// queues cached (or, from a peer that sends no id, forgotten).
func hook(cfg *syncnet.Config, store *queue.Store) {
	cfg.OnQueueDeleted = store.ForgetQueue
	cfg.OnPartitionDeleted = store.ForgetPartition
	cfg.OnQueueConfig = func(q string, c syncnet.QueueConfig, version uint64) {
		store.PeerConfigured(infoFromWire(q, c, version))
	}
}

// announce returns gateway.Config's OnQueueConfigured: the node broadcasts
// the new settings.
func announce(node *syncnet.Node) func(queue.QueueInfo) {
	return func(info queue.QueueInfo) {
		node.QueueConfigured(info.Name, wireConfig(info), uint64(max(info.Version, 0))) // #nosec G115 -- not negative
	}
}

// u64 converts a non-negative setting (validated by queue.Options).
func u64(v int) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

// wireConfig is info as QUEUE_CONFIG_SET carries it.
func wireConfig(info queue.QueueInfo) syncnet.QueueConfig {
	o := info.Options
	return syncnet.QueueConfig{
		CompletedRetentionSeconds: u64(o.CompletedRetentionSeconds), DelayedProcessing: u64(o.DelayedProcessing),
		DLQAfterMaxRetries: o.DLQAfterMaxRetries, DLQEnabled: o.DeadLetterQueue, EncryptionEnabled: o.EncryptionEnabled,
		ID: info.ID, LeaseTime: u64(o.LeaseTime), MaxSize: u64(o.MaxSize), MaxWaitTimeSeconds: u64(o.MaxWaitTimeSeconds),
		NamespaceName: info.Namespace, Priority: u64(o.Priority), RetentionEnabled: o.RetentionEnabled,
		RetentionSeconds: u64(o.RetentionSeconds), RetryDelay: u64(o.RetryDelay), RetryLimit: u64(o.RetryLimit),
		Task: info.Task, TTL: u64(o.TTL), WindowBuffer: u64(o.WindowBuffer),
		IdleGroupRetentionSeconds: new(u64(o.IdleGroupRetentionSeconds)),
	}
}

// toInt converts a wire setting; a value out of int range (only a forged or
// broken peer sends one) becomes -1, which makes the entry unusable.
func toInt(v uint64) int {
	if v > 1<<31 {
		return -1
	}
	return int(v)
}

// infoFromWire is a peer's QUEUE_CONFIG_SET as the config cache holds it. An
// entry that fails validation, or lacks an id or version (the reference
// server sends neither), carries no id: the store then only drops its own.
func infoFromWire(name string, c syncnet.QueueConfig, version uint64) queue.QueueInfo {
	o := queue.Options{
		LeaseTime: toInt(c.LeaseTime), RetryLimit: toInt(c.RetryLimit), RetryDelay: toInt(c.RetryDelay),
		DelayedProcessing: toInt(c.DelayedProcessing), WindowBuffer: toInt(c.WindowBuffer), MaxSize: toInt(c.MaxSize),
		TTL: toInt(c.TTL), RetentionSeconds: toInt(c.RetentionSeconds),
		CompletedRetentionSeconds: toInt(c.CompletedRetentionSeconds), RetentionEnabled: c.RetentionEnabled,
		DeadLetterQueue: c.DLQEnabled, DLQAfterMaxRetries: c.DLQAfterMaxRetries, Priority: toInt(c.Priority),
		EncryptionEnabled: c.EncryptionEnabled, MaxWaitTimeSeconds: toInt(c.MaxWaitTimeSeconds),
		IdleGroupRetentionSeconds: queue.IdleGroupRetentionDefault,
	}
	if c.IdleGroupRetentionSeconds != nil {
		o.IdleGroupRetentionSeconds = toInt(*c.IdleGroupRetentionSeconds)
	}
	info := queue.QueueInfo{ID: c.ID, Name: name, Namespace: c.NamespaceName, Task: c.Task, Options: o}
	if version <= 1<<62 {
		info.Version = int64(version)
	}
	if o.Validate() != nil || !queue.ValidUUID(c.ID) {
		info.ID = ""
	}
	return info
}

// State is what /internal/api/shared-state/stats shows.
type State struct {
	Enabled bool           `json:"enabled"` // syncnet configured
	Running bool           `json:"running"`
	Caches  CacheStats     `json:"caches"`
	Syncnet *syncnet.Stats `json:"syncnet,omitempty"`
}

// CacheStats are the caches' counters.
type CacheStats struct {
	QueueConfig  queue.CacheStats `json:"queueConfig"`
	PartitionIDs queue.CacheStats `json:"partitionIds"`
}

// sharedState returns gateway.Config's SharedState.
func sharedState(configs *queue.ConfigSnapshot, store *queue.Store, node *syncnet.Node) func() any {
	return func() any {
		st := State{Enabled: node != nil, Running: node != nil,
			Caches: CacheStats{QueueConfig: configs.Stats(), PartitionIDs: store.PartitionCacheStats()}}
		if node != nil {
			s := node.Stats()
			st.Syncnet = &s
		}
		return st
	}
}

// registerCacheMetrics exports the caches' counters as
// herald_cache_{hits,misses,evictions}_total{cache} and herald_cache_entries.
func registerCacheMetrics(reg prometheus.Registerer, configs *queue.ConfigSnapshot, store *queue.Store) {
	stats := map[string]func() (entries int, hits, misses, evictions uint64){
		"queue_config": func() (int, uint64, uint64, uint64) {
			s := configs.Stats()
			return s.Entries, s.Hits, s.Misses, s.Evictions
		},
		"partition_id": func() (int, uint64, uint64, uint64) {
			s := store.PartitionCacheStats()
			return s.Entries, s.Hits, s.Misses, s.Evictions
		},
	}
	for name, f := range stats {
		labels := prometheus.Labels{"cache": name}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_cache_entries", Help: "Entries in an advisory cache.",
				ConstLabels: labels}, func() float64 { e, _, _, _ := f(); return float64(e) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "herald_cache_hits_total", Help: "Cache lookups answered.",
				ConstLabels: labels}, func() float64 { _, h, _, _ := f(); return float64(h) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "herald_cache_misses_total", Help: "Cache lookups that went to the database.",
				ConstLabels: labels}, func() float64 { _, _, m, _ := f(); return float64(m) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "herald_cache_evictions_total", Help: "Entries evicted to stay within the bound.",
				ConstLabels: labels}, func() float64 { _, _, _, e := f(); return float64(e) }),
		)
	}
}
