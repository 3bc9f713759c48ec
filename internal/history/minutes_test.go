package history

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
)

// AddInstance sums the instance figures of slots: every gauge of a Slot
// merged (its samples, least, greatest and last), the scheduler latency,
// requests, errors and statements added; the queues' counts are left out.
func TestSlot_AddInstanceMergesEveryGaugeAndAddsTheCounts(t *testing.T) {
	a := Slot{Minute: 1, PopRequests: 1, DBErrors: 2, Statements: 3, Samples: 1, SchedCount: 4, SchedSumMs: 5, SchedMaxMs: 6,
		Queues: map[string]*QueueOps{"q": {PushMessages: 1}}}
	b := Slot{Minute: 2, PopRequests: 10, DBErrors: 20, Statements: 30, Samples: 2, SchedCount: 40, SchedSumMs: 50, SchedMaxMs: 3}
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	var gauges []string
	for i := range va.NumField() {
		if va.Field(i).Type() != reflect.TypeFor[Gauge]() {
			continue
		}
		gauges = append(gauges, va.Type().Field(i).Name)
		va.Field(i).Addr().Interface().(*Gauge).add(float64(i))
		gb := vb.Field(i).Addr().Interface().(*Gauge)
		gb.add(float64(100 + i))
		gb.add(float64(-i))
	}
	assert.Len(t, gauges, 11)

	var sum Slot
	sum.AddInstance(&a)
	sum.AddInstance(&b)
	vs := reflect.ValueOf(sum)
	for _, name := range gauges {
		i, _ := va.Type().FieldByName(name)
		n := float64(i.Index[0])
		assert.Equal(t, Gauge{N: 3, Sum: n + 100 + n - n, Min: -n, Max: 100 + n, Last: -n}, vs.FieldByName(name).Interface(), name)
	}
	assert.Equal(t, int64(11), sum.PopRequests)
	assert.Equal(t, int64(22), sum.DBErrors)
	assert.Equal(t, int64(33), sum.Statements)
	assert.Equal(t, 3, sum.Samples)
	assert.Equal(t, int64(44), sum.SchedCount)
	assert.Equal(t, 55.0, sum.SchedSumMs)
	assert.Equal(t, 6.0, sum.SchedMaxMs, "the greatest")
	assert.Nil(t, sum.Queues, "the queues' counts are summed apart")
	assert.Zero(t, sum.Minute)
}
