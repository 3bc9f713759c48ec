// Package layout holds no code: its tests keep the shape of the module
// true as it changes. docs_test.go requires a doc.go in every package, with
// "# Concurrency" and "# Failures" sections where the package starts
// goroutines, and no doc.go naming a file the repository lacks.
package layout
