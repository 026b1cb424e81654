// Package migrations holds the database schema of sandboxd as goose SQL
// migrations, embedded into the binary.
//
// Invariants: every file is valid for both SQLite and PostgreSQL (the store
// applies the same files to either), files are append-only once released
// (a change to the schema is a new, higher-numbered file), and each file has
// a Down section that undoes exactly its Up section.
package migrations

import "embed"

// FS holds the migration files, named NNNNN_description.sql, at its root.
//
//go:embed *.sql
var FS embed.FS
