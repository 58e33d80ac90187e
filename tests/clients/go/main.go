// pgx v5 driver test for pgcarpool: each worker has its own connection (default statement
// cache mode, so every query is a named prepared statement cached per connection) and runs
// a checked mix of queries, explicit transactions and expected errors.
//
// Usage: pgx-client <host> <port> <user> <password> <db> <workers> <iterations>
package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const table = "pgcarpool_driver_rows"

var queries atomic.Int64

func fail(format string, args ...any) error { return fmt.Errorf(format, args...) }

// expectSQLState checks that err is a server error with the given SQLSTATE.
func expectSQLState(err error, code string, what string) error {
	if err == nil {
		return fail("%s: expected SQLSTATE %s, got success", what, code)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fail("%s: expected SQLSTATE %s, got %v", what, code, err)
	}
	if pgErr.Code != code {
		return fail("%s: expected SQLSTATE %s, got %s (%s)", what, code, pgErr.Code, pgErr.Message)
	}
	return nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func checkPair(ctx context.Context, q querier, a int, tag string, what string) error {
	var n int
	var s string
	if err := q.QueryRow(ctx, "select $1::int * 2, $2::text || 'x'", a, tag).Scan(&n, &s); err != nil {
		return fail("%s: %v", what, err)
	}
	if n != 2*a || s != tag+"x" {
		return fail("%s: got (%d, %q), want (%d, %q)", what, n, s, 2*a, tag+"x")
	}
	queries.Add(1)
	return nil
}

func countRows(ctx context.Context, q querier, run int64, w int, want int, what string) error {
	var n int
	if err := q.QueryRow(ctx, "select count(*)::int from "+table+" where run = $1 and worker = $2", run, w).Scan(&n); err != nil {
		return fail("%s: %v", what, err)
	}
	if n != want {
		return fail("%s: row count %d, want %d", what, n, want)
	}
	queries.Add(1)
	return nil
}

func worker(ctx context.Context, dsn string, run int64, w, iterations int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fail("worker %d: connect: %v", w, err)
	}
	defer conn.Close(context.Background())
	inserted := 0
	for i := 0; i < iterations; i++ {
		a := w*100000 + i
		tag := fmt.Sprintf("w%d-i%d", w, i)
		where := fmt.Sprintf("worker %d iteration %d", w, i)
		if err := checkPair(ctx, conn, a, tag, where+" pair"); err != nil {
			return err
		}
		// Several distinct statements so the statement cache holds many.
		for _, k := range []int{i % 10, (i*7 + w + 3) % 10} {
			var v int
			if err := conn.QueryRow(ctx, fmt.Sprintf("select $1::int + %d", k), a).Scan(&v); err != nil {
				return fail("%s plus %d: %v", where, k, err)
			}
			if v != a+k {
				return fail("%s plus %d: got %d, want %d", where, k, v, a+k)
			}
			queries.Add(1)
		}
		if i%2 == 1 {
			n := i%50 + 1
			var c, s int
			if err := conn.QueryRow(ctx, "select count(*)::int, coalesce(sum(g), 0)::int from generate_series(1, $1::int) g", n).Scan(&c, &s); err != nil {
				return fail("%s series: %v", where, err)
			}
			if c != n || s != n*(n+1)/2 {
				return fail("%s series: got (%d, %d), want (%d, %d)", where, c, s, n, n*(n+1)/2)
			}
			queries.Add(1)
		}
		if i%3 == 0 {
			// Explicit transaction: insert, read back the count, another select, commit.
			tx, err := conn.Begin(ctx)
			if err != nil {
				return fail("%s begin: %v", where, err)
			}
			if _, err := tx.Exec(ctx, "insert into "+table+" (driver, run, worker, iter, note) values ($1, $2, $3, $4, $5)", "pgx", run, w, i, tag); err != nil {
				tx.Rollback(ctx)
				return fail("%s insert: %v", where, err)
			}
			queries.Add(1)
			if err := countRows(ctx, tx, run, w, inserted+1, where+" count in txn"); err != nil {
				tx.Rollback(ctx)
				return err
			}
			if err := checkPair(ctx, tx, a+1, tag+"t", where+" pair in txn"); err != nil {
				tx.Rollback(ctx)
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return fail("%s commit: %v", where, err)
			}
			inserted++
		}
		if i%5 == 2 {
			// A prepared statement that fails: the error must reach this client.
			var v int
			err := conn.QueryRow(ctx, "select 10 / $1::int", 0).Scan(&v)
			if e := expectSQLState(err, "22012", where+" division by zero"); e != nil {
				return e
			}
			queries.Add(1)
		}
		if i%10 == 7 {
			// An error inside a transaction, then rollback: the insert must be gone.
			tx, err := conn.Begin(ctx)
			if err != nil {
				return fail("%s begin: %v", where, err)
			}
			if _, err := tx.Exec(ctx, "insert into "+table+" (driver, run, worker, iter, note) values ($1, $2, $3, $4, $5)", "pgx", run, w, i, "rolled back"); err != nil {
				tx.Rollback(ctx)
				return fail("%s insert: %v", where, err)
			}
			queries.Add(1)
			var v int
			err = tx.QueryRow(ctx, "select 10 / $1::int", 0).Scan(&v)
			if e := expectSQLState(err, "22012", where+" division by zero in txn"); e != nil {
				tx.Rollback(ctx)
				return e
			}
			queries.Add(1)
			if err := tx.Rollback(ctx); err != nil {
				return fail("%s rollback: %v", where, err)
			}
			if err := countRows(ctx, conn, run, w, inserted, where+" count after rollback"); err != nil {
				return err
			}
		}
	}
	return countRows(ctx, conn, run, w, inserted, fmt.Sprintf("worker %d final count", w))
}

func main() {
	if len(os.Args) != 8 {
		fmt.Fprintln(os.Stderr, "usage: pgx-client <host> <port> <user> <password> <db> <workers> <iterations>")
		os.Exit(2)
	}
	host, port, user, password, db := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]
	workers, err1 := strconv.Atoi(os.Args[6])
	iterations, err2 := strconv.Atoi(os.Args[7])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "workers and iterations must be integers")
		os.Exit(2)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: host + ":" + port, Path: "/" + db, RawQuery: "sslmode=disable"}
	dsn := u.String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	setup, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Println("setup connect:", err)
		os.Exit(1)
	}
	_, err = setup.Exec(ctx, "create table if not exists "+table+" (driver text, run bigint, worker int, iter int, note text)")
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07")) {
		fmt.Println("setup create table:", err)
		os.Exit(1)
	}
	setup.Close(ctx)

	run := rand.New(rand.NewSource(time.Now().UnixNano())).Int63()
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs[w] = worker(ctx, dsn, run, w, iterations)
		}(w)
	}
	wg.Wait()
	failed := false
	for _, err := range errs {
		if err != nil {
			fmt.Println("FAIL:", err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
	fmt.Printf("ok %d queries\n", queries.Load())
}
