// Package store owns sandboxd's database: the schema (goose migrations in
// store/migrations, applied by Open), and every query the rest of sandboxd
// runs against it. One schema and one set of queries serve both SQLite (the
// single-node default, through the pure-Go modernc.org/sqlite driver) and
// PostgreSQL (shared by many nodes, through pgx's database/sql driver).
//
// Invariants:
//   - Queries are written once with '?' placeholders and rebound to '$n' for
//     PostgreSQL; nothing else differs between the dialects.
//   - Times go in and come out as UTC with millisecond precision: they are
//     stored as BIGINT unix milliseconds, and Create methods truncate the
//     times in the row they are given, so the caller's copy equals what a
//     later Get returns.
//   - A missing row is ErrNotFound; a unique-key collision is ErrConflict; a
//     value the schema rejects is ErrInvalid; all three are wrapped with what
//     was being done, so test with errors.Is.
//   - On SQLite every write goes through a single connection and every
//     transaction begins IMMEDIATE, so writers queue behind one another (and
//     behind other processes, through busy_timeout) instead of failing with
//     SQLITE_BUSY. Reads use a separate read-only pool and run concurrently
//     with writes (WAL).
//
// A Queries value carries every method and is bound either to the database
// or to one transaction; Store embeds one bound to the database, and InTx
// hands fn one bound to the transaction. The *sql.DB (DB) and *sql.Tx (InTx)
// are exposed so that River can insert jobs in the same transaction.
package store
