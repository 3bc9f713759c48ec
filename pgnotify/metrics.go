package pgnotify

import "github.com/prometheus/client_golang/prometheus"

// counter is a counter named name, described by help.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// register registers cs on reg (the Registerer of a component's Config),
// stopping at the first it refuses; a nil reg registers nothing.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
