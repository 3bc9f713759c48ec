// Package tick has the periodic loops of one process wake together: a
// loop that waits on a Timer of tick's instead of a time.Ticker of its own
// wakes at the same instants as every other loop of the process whose
// period it shares (or divides), so an idle instance wakes once for its
// members beat and its history sample, not once for each. Each wake-up of
// an idle Go process costs more in the runtime (the scheduler, sysmon)
// than the duty it wakes for, so the number of wake-ups is the figure to
// keep low.
//
// The instants are whole periods from an anchor drawn for the process at
// random (within the minute before it started), so that instances
// started together do not all wake, and reach the database, at once.
//
// It imports no Herald package.
package tick
