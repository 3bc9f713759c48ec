// Package spool is an instance's durable buffer of pushes that may not go
// to PostgreSQL yet: while push maintenance is on (docs/design.md,
// "Maintenance modes") the gateway appends each request's items here and
// answers only once they are on disk; when it ends, Drain hands them back
// in order to be stored. The records are opaque bytes to this package.
//
// # Files
//
// A Dir is a directory several processes may share (herald instances on
// one data directory). Each process owns one slot file, push-<n>.buf, the
// first it can lock (flock, exclusive, non-blocking), for as long as it
// runs; a slot nobody holds belongs to a process that stopped, and Drain
// adopts it (locks, drains, truncates, unlocks). Files are truncated,
// never removed: a process that opened a removed file would lock an inode
// no path leads to.
//
//	push-<n>.buf   a 16-byte header: "hspool01", then a random epoch
//	               (8 bytes) drawn each time the file starts empty;
//	               then records, appended:
//	               offset size
//	               0      4    length n of the data, big-endian
//	               4      4    CRC-32C (Castagnoli) of the data
//	               8      n    the data
//	push-<n>.pos   "<epoch, hex> <drained prefix of push-<n>.buf, bytes>";
//	               a position of another epoch (written before a
//	               truncation) counts as none
//
// Append writes a request's records with one write and returns after an
// fsync (appends that arrive during an fsync share the next one). Open
// scans the file: a torn tail (a crash during a write, which no caller
// saw acknowledged) is cut off. Drain stores a batch, then records how far
// it got in the .pos file (without fsync: a lost position only means
// storing a batch again, which the caller makes idempotent), and
// truncates the file once everything is stored. So a crash at any point
// loses nothing acknowledged, and stores some records again at worst.
//
// # Concurrency
//
// Every method is safe for concurrent use; the package starts no
// goroutine. A segment's mu guards its file's length, drained position and
// record count; appends write under the owned segment's mu and fsync under
// syncMu; one Drain runs at a time (drainMu) and reads records without mu,
// since appends only add past what it reads. Lock order: drainMu before mu,
// syncMu before mu. Drain calls its Store with drainMu held (and mu not),
// so Close, which takes drainMu, waits for the batch being stored: the
// caller's stop func and ctx bound that wait.
//
// # Failures
//
// A full Dir (Config.MaxBytes) refuses an Append whole with ErrFull. A
// write that fails is cut back off the file; if even that fails the Dir
// refuses every later Append (the process must restart). A record whose
// checksum fails mid-file (the disk changed it) ends the scan there: what
// follows is cut off and logged. A slot file without the header's magic is
// not this package's: Open and Drain log it and pass it by. A Store
// error ends the drain where it stopped; the rest waits for the next
// Drain. A position that cannot be written is logged: the records after
// the last one written are offered again after a restart.
package spool
