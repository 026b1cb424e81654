package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestOpenSQLiteDSNs(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		dsn     string
		wantErr bool
	}{
		{"plain path", filepath.Join(dir, "a.db"), false},
		{"sqlite:// absolute", "sqlite://" + filepath.Join(dir, "b.db"), false},
		{"sqlite: absolute", "sqlite:" + filepath.Join(dir, "c.db"), false},
		{"empty", "", true},
		{"empty after scheme", "sqlite://", true},
		{"query string", filepath.Join(dir, "d.db") + "?_pragma=foreign_keys(0)", true},
		{"memory", ":memory:", true},
		{"uri", "file:" + filepath.Join(dir, "e.db"), true},
		{"missing directory", filepath.Join(dir, "nope", "f.db"), true},
		{"directory is a file", filepath.Join(dir, "a.db", "g.db"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := store.Open(t.Context(), tt.dsn, nil)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Open(%q) error = %v, want error %v", tt.dsn, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			defer s.Close()
			if s.Dialect() != store.DialectSQLite {
				t.Errorf("Dialect() = %q", s.Dialect())
			}
			var fk, timeout int
			var mode string
			db := s.DB()
			if err := db.QueryRowContext(t.Context(), "PRAGMA foreign_keys").Scan(&fk); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRowContext(t.Context(), "PRAGMA busy_timeout").Scan(&timeout); err != nil {
				t.Fatal(err)
			}
			if fk != 1 || mode != "wal" || timeout < 1000 {
				t.Errorf("foreign_keys=%d journal_mode=%s busy_timeout=%d; want 1, wal, >= 1000", fk, mode, timeout)
			}
		})
	}
}

func TestOpenPostgresUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := store.Open(ctx, "postgres://nobody:secret@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", nil)
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the password: %v", err)
	}
}

func TestMigrationsIdempotent(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s1 := storetest.Open(t, dsn)
		a := mustAccount(t, s1, store.AccountPersonal, "Alice")
		if err := s1.Close(); err != nil {
			t.Fatal(err)
		}
		// Reopening applies nothing and keeps the data; so do several
		// processes' worth of concurrent opens.
		var wg sync.WaitGroup
		stores := make([]*store.Store, 4)
		for i := range stores {
			wg.Go(func() {
				s, err := store.Open(t.Context(), dsn, nil)
				if err != nil {
					t.Errorf("reopen: %v", err)
					return
				}
				stores[i] = s
			})
		}
		wg.Wait()
		for _, s := range stores {
			if s == nil {
				t.FailNow()
			}
			defer s.Close()
		}
		s := stores[0]
		if _, err := s.GetAccount(t.Context(), a.ID); err != nil {
			t.Fatalf("account lost on reopen: %v", err)
		}
		var versions, applied int
		err := s.DB().QueryRowContext(t.Context(), "SELECT COUNT(*), COUNT(DISTINCT version_id) FROM goose_db_version").Scan(&versions, &applied)
		if err != nil {
			t.Fatal(err)
		}
		if versions != applied || versions < 2 {
			t.Errorf("goose_db_version has %d rows for %d versions; want one row per version", versions, applied)
		}
	})
}

func TestConcurrentOpenOfNewDatabase(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				s, err := store.Open(t.Context(), dsn, nil)
				if err != nil {
					t.Errorf("concurrent first open: %v", err)
					return
				}
				s.Close()
			})
		}
		wg.Wait()
	})
}

func TestInTx(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		errBoom := errors.New("boom")

		tests := []struct {
			name     string
			fn       func(tx *sql.Tx, q *store.Queries) error
			panics   bool
			wantErr  error
			wantRuns int // runs of alice afterwards (cumulative)
		}{
			{"commit", func(tx *sql.Tx, q *store.Queries) error {
				if err := q.CreateRun(ctx, &store.Run{AccountID: alice.ID, Task: "t"}); err != nil {
					return err
				}
				// Raw statements on tx share the transaction (as River's inserts will).
				_, err := tx.ExecContext(ctx, "UPDATE accounts SET name = 'Alice Tx' WHERE id = '"+alice.ID+"'")
				return err
			}, false, nil, 1},
			{"error rolls back", func(tx *sql.Tx, q *store.Queries) error {
				if err := q.CreateRun(ctx, &store.Run{AccountID: alice.ID, Task: "t"}); err != nil {
					return err
				}
				return errBoom
			}, false, errBoom, 1},
			{"panic rolls back", func(tx *sql.Tx, q *store.Queries) error {
				if err := q.CreateRun(ctx, &store.Run{AccountID: alice.ID, Task: "t"}); err != nil {
					return err
				}
				panic("boom")
			}, true, nil, 1},
			{"failed statement rolls back", func(tx *sql.Tx, q *store.Queries) error {
				if err := q.CreateRun(ctx, &store.Run{AccountID: alice.ID, Task: "t"}); err != nil {
					return err
				}
				return q.CreateRun(ctx, &store.Run{AccountID: "missing", Task: "t"})
			}, false, store.ErrNotFound, 1},
			{"reads see own writes", func(tx *sql.Tx, q *store.Queries) error {
				r := store.Run{AccountID: alice.ID, Task: "t"}
				if err := q.CreateRun(ctx, &r); err != nil {
					return err
				}
				if _, err := q.GetRun(ctx, r.ID); err != nil {
					return err
				}
				// Multi-statement methods join the caller's transaction.
				_, err := q.DeleteSnapshotsOf(ctx, alice.ID)
				return err
			}, false, nil, 2},
		}
		for _, tt := range tests {
			func() {
				defer func() {
					if r := recover(); (r != nil) != tt.panics {
						t.Fatalf("%s: recovered %v, want panic %v", tt.name, r, tt.panics)
					}
				}()
				wantErr(t, tt.name, s.InTx(ctx, tt.fn), tt.wantErr)
			}()
			runs, err := s.ListRuns(ctx, alice.ID, 0)
			if err != nil || len(runs) != tt.wantRuns {
				t.Fatalf("%s: %d runs (%v), want %d", tt.name, len(runs), err, tt.wantRuns)
			}
		}
		if a, _ := s.GetAccount(ctx, alice.ID); a.Name != "Alice Tx" {
			t.Errorf("raw statement on tx not committed: name %q", a.Name)
		}
	})
}

func TestTimesRoundTrip(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		tests := []struct {
			name string
			in   time.Time
			want time.Time
		}{
			{"sub-millisecond in another zone", t0, t0ms},
			{"exact millisecond", time.Date(2030, 1, 2, 3, 4, 5, 6e6, time.UTC), time.Date(2030, 1, 2, 3, 4, 5, 6e6, time.UTC)},
			{"before 1970", time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(1969, 12, 31, 23, 59, 59, 999e6, time.UTC)},
			{"zero", time.Time{}, time.Time{}},
			{"far future", time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)},
		}
		for _, tt := range tests {
			sb := store.Sandbox{AccountID: alice.ID, NodeID: "n", Runtime: "r", CreatedAt: t0, Deadline: tt.in, StoppedAt: ptr(tt.in)}
			if err := s.CreateSandbox(ctx, &sb); err != nil {
				t.Fatal(err)
			}
			if sb.Deadline != tt.want {
				t.Errorf("%s: Create normalized %v to %v, want %v", tt.name, tt.in, sb.Deadline, tt.want)
			}
			got, err := s.GetSandbox(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Deadline != tt.want || *got.StoppedAt != tt.want {
				t.Errorf("%s: stored %v, read back %v / %v, want %v", tt.name, tt.in, got.Deadline, *got.StoppedAt, tt.want)
			}
			if !tt.want.IsZero() && got.Deadline.Location() != time.UTC {
				t.Errorf("%s: read back in %v, want UTC", tt.name, got.Deadline.Location())
			}
		}
	})
}

// TestConcurrentWriters has many goroutines write at once, through plain
// calls and transactions: none may fail (on SQLite, with SQLITE_BUSY).
func TestConcurrentWriters(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		const workers, each = 20, 25
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					r := store.Run{AccountID: alice.ID, Task: "t", Payload: json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))}
					var err error
					if i%5 == 0 {
						err = s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
							if err := q.CreateRun(ctx, &r); err != nil {
								return err
							}
							_, err := q.StartRun(ctx, r.ID, time.Now())
							return err
						})
					} else {
						err = s.CreateRun(ctx, &r)
					}
					if err != nil {
						t.Errorf("worker %d run %d: %v", w, i, err)
						return
					}
					if _, err := s.GetRun(ctx, r.ID); err != nil {
						t.Errorf("worker %d read: %v", w, err)
						return
					}
				}
			})
		}
		wg.Wait()
		runs, err := s.ListRuns(ctx, alice.ID, 0)
		if err != nil || len(runs) != workers*each {
			t.Fatalf("%d runs (%v), want %d", len(runs), err, workers*each)
		}
	})
}

// TestReadsDuringWriteTransaction checks that reads are not blocked by a
// long write transaction (SQLite: WAL and the separate read pool).
func TestReadsDuringWriteTransaction(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		inside := make(chan struct{})
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
				if err := q.CreateRun(ctx, &store.Run{AccountID: alice.ID, Task: "t"}); err != nil {
					return err
				}
				close(inside)
				<-release
				return nil
			})
		}()
		<-inside
		for range 10 {
			runs, err := s.ListRuns(ctx, alice.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) != 0 {
				t.Fatalf("read saw an uncommitted run")
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if runs, _ := s.ListRuns(ctx, alice.ID, 0); len(runs) != 1 {
			t.Fatalf("%d runs after commit, want 1", len(runs))
		}
	})
}

// TestTwoStoresOneSQLiteFile writes through two Stores on one file at once,
// as the admin CLI does next to a running server.
func TestTwoStoresOneSQLiteFile(t *testing.T) {
	dsn := storetest.SQLiteDSN(t)
	s1 := storetest.Open(t, dsn)
	s2 := storetest.Open(t, dsn)
	ctx := t.Context()
	alice := mustAccount(t, s1, store.AccountPersonal, "Alice")
	var wg sync.WaitGroup
	for i, s := range []*store.Store{s1, s2, s1, s2} {
		wg.Go(func() {
			for j := range 50 {
				err := s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
					return q.CreateRun(ctx, &store.Run{AccountID: alice.ID, Task: "t", Payload: json.RawMessage(strconv.Itoa(i*1000 + j))})
				})
				if err != nil {
					t.Errorf("writer %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if runs, err := s2.ListRuns(ctx, alice.ID, 0); err != nil || len(runs) != 200 {
		t.Fatalf("%d runs (%v), want 200", len(runs), err)
	}
}

// Environment of the helper process of TestSecondProcessSQLite.
const (
	envHelperDB      = "SANDBOXD_STORE_TEST_HELPER_DB"
	envHelperAccount = "SANDBOXD_STORE_TEST_HELPER_ACCOUNT"
)

// TestSecondProcessSQLite writes to one SQLite file from this process and
// from a second one at the same time: SQLite's file locks, not just its
// in-process ones, must make writers wait rather than fail.
func TestSecondProcessSQLite(t *testing.T) {
	if os.Getenv(envHelperDB) != "" {
		t.Skip("running as the helper")
	}
	dsn := storetest.SQLiteDSN(t)
	s := storetest.Open(t, dsn)
	ctx := t.Context()
	alice := mustAccount(t, s, store.AccountPersonal, "Alice")

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSecondProcessHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelperDB+"="+dsn, envHelperAccount+"="+alice.ID)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	const mine = 300
	for i := range mine {
		err := s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
			r := store.Run{AccountID: alice.ID, Task: "parent", Payload: json.RawMessage(strconv.Itoa(i))}
			if err := q.CreateRun(ctx, &r); err != nil {
				return err
			}
			_, err := q.StartRun(ctx, r.ID, time.Now())
			return err
		})
		if err != nil {
			t.Fatalf("parent write %d: %v", i, err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper process: %v\n%s", err, out.String())
	}
	runs, err := s.ListRuns(ctx, alice.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	byTask := map[string]int{}
	for _, r := range runs {
		byTask[r.Task]++
	}
	if byTask["parent"] != mine || byTask["helper"] != helperRuns {
		t.Fatalf("runs by writer = %v, want parent %d, helper %d\nhelper output:\n%s", byTask, mine, helperRuns, out.String())
	}
}

const helperRuns = 300

// TestSecondProcessHelper is the second process of TestSecondProcessSQLite.
func TestSecondProcessHelper(t *testing.T) {
	dsn := os.Getenv(envHelperDB)
	if dsn == "" {
		t.Skip("only run by TestSecondProcessSQLite")
	}
	s := storetest.Open(t, dsn)
	ctx := t.Context()
	for i := range helperRuns {
		r := store.Run{AccountID: os.Getenv(envHelperAccount), Task: "helper", Payload: json.RawMessage(strconv.Itoa(i))}
		if err := s.CreateRun(ctx, &r); err != nil {
			t.Fatalf("helper write %d: %v", i, err)
		}
	}
}
