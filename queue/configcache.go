package queue

import (
	"context"
	"fmt"
	"time"
)

// QueueInfo is a queue's stored identity and settings, as the config cache
// holds it.
type QueueInfo struct {
	ID        string
	Name      string
	Namespace string
	Task      string
	Options   Options
	Version   int64 // bumped by every configure
}

// ConfigCache is an advisory cache of queue settings (ConfigSnapshot is
// one). Reads must not block. Nothing read from it decides correctness: a
// stale entry costs at most a retry, a missing one a lookup.
type ConfigCache interface {
	Get(name string) (QueueInfo, bool)
	Peek(name string) (QueueInfo, bool)
	Set(name string, info QueueInfo, accept func(old QueueInfo) bool)
	Delete(name string)
	Keys() []string
	Replace(fresh map[string]QueueInfo, gone []string)
}

// ConfigCacheSize bounds the queue config cache (about 500 bytes an entry).
const ConfigCacheSize = 10000

// ConfigRefreshDefault is how often the cached configs are read again from
// the database, healing any change whose broadcast was lost.
const ConfigRefreshDefault = 60 * time.Second

// newer accepts info over a cached entry of another queue id or an older
// version.
func newer(info QueueInfo) func(QueueInfo) bool {
	return func(old QueueInfo) bool { return old.ID != info.ID || info.Version >= old.Version }
}

// scanQueueInfo reads the columns of queueInfoColumns.
func scanQueueInfo(row interface{ Scan(...any) error }, qi *QueueInfo) error {
	o := &qi.Options
	return row.Scan(&qi.Name, &qi.ID, &qi.Version, &qi.Namespace, &qi.Task, &o.LeaseTime, &o.RetryLimit,
		&o.RetryDelay, &o.DelayedProcessing, &o.WindowBuffer, &o.MaxSize, &o.TTL, &o.RetentionSeconds,
		&o.CompletedRetentionSeconds, &o.RetentionEnabled, &o.DeadLetterQueue, &o.DLQAfterMaxRetries, &o.Priority,
		&o.EncryptionEnabled, &o.MaxWaitTimeSeconds, &o.IdleGroupRetentionSeconds)
}

// queueInfoColumns are the columns scanQueueInfo reads, of a queues row q.
const queueInfoColumns = `q.name, q.id::text, q.version, q.namespace, q.task, q.lease_time, q.retry_limit,
	q.retry_delay, q.delayed_processing, q.window_buffer, q.max_size, q.ttl, q.retention_seconds,
	q.completed_retention_seconds, q.retention_enabled, q.dead_letter_queue, q.dlq_after_max_retries,
	q.priority, q.encryption_enabled, q.max_wait_time_seconds, q.idle_group_retention_seconds`

// CachedConfig returns a queue's settings from the cache, without touching
// the database; ok is false on a miss.
func (s *Store) CachedConfig(name string) (QueueInfo, bool) { return s.configs.Get(name) }

// QueueConfig returns a queue's settings, from the cache or, on a miss, from
// the database (then cached). ok is false when the queue does not exist.
func (s *Store) QueueConfig(ctx context.Context, name string) (info QueueInfo, ok bool, err error) {
	if info, ok := s.CachedConfig(name); ok {
		return info, true, nil
	}
	rows, err := s.pool.Query(ctx, `-- herald:queue_config
		SELECT `+queueInfoColumns+` FROM queues q WHERE q.name = $1`, name)
	if err != nil {
		return QueueInfo{}, false, fmt.Errorf("reading queue %s: %w", name, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scanQueueInfo(rows, &info); err != nil {
			return QueueInfo{}, false, fmt.Errorf("reading queue %s: %w", name, err)
		}
		ok = true
	}
	if err := rows.Err(); err != nil {
		return QueueInfo{}, false, fmt.Errorf("reading queue %s: %w", name, err)
	}
	if ok {
		s.cacheConfig(info)
	}
	return info, ok, nil
}

// cacheConfig stores info unless a newer version is cached.
func (s *Store) cacheConfig(info QueueInfo) { s.configs.Set(info.Name, info, newer(info)) }

// PeerConfigured applies another instance's news that a queue was
// configured (syncnet's QUEUE_CONFIG_SET). With the queue's id and a version
// it replaces an older cached entry; without them (the reference server
// sends neither) it only drops the entry, to be read again on next use.
func (s *Store) PeerConfigured(info QueueInfo) {
	if info.ID == "" || info.Version == 0 {
		s.configs.Delete(info.Name)
		return
	}
	s.configs.Set(info.Name, info, newer(info))
}

// RefreshConfigs reads every cached queue again in one query: changed
// settings replace the cached ones, deleted queues leave the cache (and so
// do their partition ids).
func (s *Store) RefreshConfigs(ctx context.Context) error {
	names := s.configs.Keys()
	if len(names) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `-- herald:queue_config_refresh
		SELECT `+queueInfoColumns+` FROM queues q WHERE q.name = ANY($1::text[])`, names)
	if err != nil {
		return fmt.Errorf("refreshing queue configs: %w", err)
	}
	defer rows.Close()
	fresh := make(map[string]QueueInfo, len(names))
	for rows.Next() {
		var info QueueInfo
		if err := scanQueueInfo(rows, &info); err != nil {
			return fmt.Errorf("refreshing queue configs: %w", err)
		}
		fresh[info.Name] = info
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("refreshing queue configs: %w", err)
	}
	var gone []string
	for _, n := range names {
		old, cached := s.configs.Peek(n)
		info, ok := fresh[n]
		switch {
		case !ok:
			gone = append(gone, n)
			s.forgetPartitions(n)
		case cached && old.ID != info.ID:
			s.forgetPartitions(n) // recreated under the same name: new partition ids
		}
	}
	s.configs.Replace(fresh, gone)
	return nil
}

// RunConfigRefresh calls RefreshConfigs every interval (zero:
// ConfigRefreshDefault) until ctx ends.
func (s *Store) RunConfigRefresh(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = ConfigRefreshDefault
	}
	every(ctx, interval, func() {
		if err := s.RefreshConfigs(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("refreshing queue configs")
		}
	})
	return nil
}

// every calls f every interval until ctx ends (the store's background
// loops: config refresh, retention, hygiene).
func every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
