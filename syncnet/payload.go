package syncnet

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Payloads are MessagePack maps whose keys are in bytewise order and whose
// integers take their smallest unsigned encoding, as the reference server
// writes them (nlohmann::json to_msgpack): struct fields below are declared
// in key order.

// MessageAvailablePayload: a push committed to queue/partition.
type MessageAvailablePayload struct {
	Partition string `msgpack:"partition"`
	Queue     string `msgpack:"queue"`
	TS        uint64 `msgpack:"ts"` // ms since the Unix epoch
}

// HeartbeatPayload: the sender is alive. SessionID is the full 16-character
// session (the header carries 15); Sequence counts datagrams sent.
type HeartbeatPayload struct {
	Sequence  uint64 `msgpack:"sequence"`
	SessionID string `msgpack:"session_id"`
	TS        uint64 `msgpack:"ts"`
}

// QueueConfig is a queue's configuration as QUEUE_CONFIG_SET carries it.
type QueueConfig struct {
	CompletedRetentionSeconds uint64 `msgpack:"completed_retention_seconds"`
	DelayedProcessing         uint64 `msgpack:"delayed_processing"`
	DLQAfterMaxRetries        bool   `msgpack:"dlq_after_max_retries"`
	DLQEnabled                bool   `msgpack:"dlq_enabled"`
	EncryptionEnabled         bool   `msgpack:"encryption_enabled"`
	ID                        string `msgpack:"id"`
	// IdleGroupRetentionSeconds is Herald's own (the reference server
	// neither sends nor reads it): absent, it is the default.
	IdleGroupRetentionSeconds *uint64 `msgpack:"idle_group_retention_seconds,omitempty"`
	LeaseTime                 uint64  `msgpack:"lease_time"`
	MaxSize                   uint64  `msgpack:"max_size"`
	MaxWaitTimeSeconds        uint64  `msgpack:"max_wait_time_seconds"`
	NamespaceName             string  `msgpack:"namespace_name"`
	Priority                  uint64  `msgpack:"priority"`
	RetentionEnabled          bool    `msgpack:"retention_enabled"`
	RetentionSeconds          uint64  `msgpack:"retention_seconds"`
	RetryDelay                uint64  `msgpack:"retry_delay"`
	RetryLimit                uint64  `msgpack:"retry_limit"`
	Task                      string  `msgpack:"task"`
	TTL                       uint64  `msgpack:"ttl"`
	WindowBuffer              uint64  `msgpack:"window_buffer"`
}

// QueueConfigSetPayload: a queue was configured.
type QueueConfigSetPayload struct {
	Config  QueueConfig `msgpack:"config"`
	Queue   string      `msgpack:"queue"`
	Version uint64      `msgpack:"version"`
}

// QueueConfigDeletePayload: a queue was deleted.
type QueueConfigDeletePayload struct {
	Queue string `msgpack:"queue"`
}

// MaintenancePayload: MAINTENANCE_MODE_SET and POP_MAINTENANCE_MODE_SET.
type MaintenancePayload struct {
	Enabled bool   `msgpack:"enabled"`
	TS      uint64 `msgpack:"ts"`
}

// Marshal encodes a payload the way the reference server does.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("syncnet: encoding %T: %w", v, err)
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes a payload; unknown keys are ignored and missing ones
// keep their zero values.
func Unmarshal(b []byte, v any) error {
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("syncnet: decoding %T: %w", v, err)
	}
	return nil
}

// PartitionDeletedPayload: a partition was deleted (retention); peers drop
// its cached id.
type PartitionDeletedPayload struct {
	Partition string `msgpack:"partition"`
	Queue     string `msgpack:"queue"`
}

// LeaseHintPayload: LEASE_HINT_ACQUIRED and LEASE_HINT_RELEASED. The seed's
// keys, plus the queue and partition names so that a release can wake the
// receiver's consumers of that partition. ExpiresAtMS is when the lease
// ends (ms since the Unix epoch); zero in a release.
type LeaseHintPayload struct {
	ConsumerGroup string `msgpack:"consumer_group"`
	ExpiresAtMS   uint64 `msgpack:"expires_at_ms"`
	Partition     string `msgpack:"partition"`
	PartitionID   string `msgpack:"partition_id"`
	Queue         string `msgpack:"queue"`
	ServerID      string `msgpack:"server_id"`
}
