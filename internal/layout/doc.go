// Package layout holds no code: its tests keep the shape of the module
// true as it changes.
//
// TestImports_FollowDesign reads every package of the module with go list
// and fails on an import that the package table of docs/design.md (§1,
// "one package, one job") forbids: queue imports no other Herald package,
// poller only queue, pgnotify, syncnet and spool none, gateway no wake
// source or assembly, client no server package, and only cmd/* (and tests)
// the assembly in internal/server. The same rules are depguard rules in
// .golangci.yml; this test makes them hold under a plain go test too. A new
// package fails the test until it has a row in the test's table: its place
// in the layout is a decision, not a default.
//
// funcs_test.go keeps every function of the message path (gateway,
// poller, syncnet, pgnotify, spool, and queue but its administration and
// maintenance files) at most 80 lines long.
//
// docs_test.go requires a doc.go in every package, with "# Concurrency"
// and "# Failures" sections where the package starts goroutines, and no
// doc.go naming a file the repository lacks.
package layout
