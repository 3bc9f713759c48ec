package server

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// A queue's settings survive QUEUE_CONFIG_SET, encoded and decoded.
func TestConfigRoundTrip(t *testing.T) {
	o := queue.DefaultOptions()
	o.LeaseTime, o.RetryLimit, o.DelayedProcessing, o.WindowBuffer, o.MaxSize = 45, 7, 3, 2, 1000
	o.RetentionSeconds, o.CompletedRetentionSeconds, o.MaxWaitTimeSeconds, o.Priority = 60, 30, 90, 5
	o.RetentionEnabled, o.DeadLetterQueue, o.DLQAfterMaxRetries, o.EncryptionEnabled = true, true, true, true
	info := queue.QueueInfo{ID: queue.NewID(), Name: "orders", Namespace: "shop", Task: "orders", Options: o, Version: 9}

	b, err := syncnet.Marshal(syncnet.QueueConfigSetPayload{Config: wireConfig(info), Queue: info.Name, Version: 9})
	assert.NoError(t, err)
	var p syncnet.QueueConfigSetPayload
	assert.NoError(t, syncnet.Unmarshal(b, &p))
	assert.Equal(t, info, infoFromWire(p.Queue, p.Config, p.Version))
}

// What the reference server sends (no id, version 0), or a value no queue
// can have, yields an entry without an id: the store only drops its own.
func TestInfoFromWire_Unusable(t *testing.T) {
	ref := syncnet.QueueConfig{LeaseTime: 300, RetryLimit: 3}
	assert.Empty(t, infoFromWire("q", ref, 0).ID)
	bad := syncnet.QueueConfig{ID: queue.NewID(), LeaseTime: 1 << 40}
	assert.Empty(t, infoFromWire("q", bad, 3).ID, "a lease time out of range")
	zero := syncnet.QueueConfig{ID: queue.NewID()}
	assert.Empty(t, infoFromWire("q", zero, 3).ID, "a zero lease time is invalid")
}
