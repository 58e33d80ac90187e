// pgx v5 clients of one application loop (tests/read_routing.rs): each writes a row and
// bumps a counter in one transaction (conn.Begin), then reads the row back outside a
// transaction and the counter in a read-only one (BeginTx ReadOnly: `begin read only`),
// with pgx's default statement cache (named prepared statements). A read is stale when
// the row is missing or the counter is below what the client wrote or read before.
//
// Writes go through writeDSN, reads through readDSN (the same: one connection). Prints
// `ok <rounds> rounds <stale> stale`; exits 1 (printing why) on any error.
//
// Usage: read-loop <writeDSN> <readDSN> <clients> <rounds>
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

func client(ctx context.Context, writeDSN, readDSN string, rounds int) (int, error) {
	w, err := pgx.Connect(ctx, writeDSN)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer w.Close(ctx)
	r := w
	if readDSN != writeDSN {
		if r, err = pgx.Connect(ctx, readDSN); err != nil {
			return 0, fmt.Errorf("connect: %w", err)
		}
		defer r.Close(ctx)
	}
	stale := 0
	var last int64
	for k := 0; k < rounds; k++ {
		tx, err := w.Begin(ctx)
		if err != nil {
			return stale, fmt.Errorf("begin: %w", err)
		}
		var id, n int64
		if err := tx.QueryRow(ctx, "INSERT INTO t (v) VALUES ($1) RETURNING id", k).Scan(&id); err != nil {
			return stale, fmt.Errorf("insert: %w", err)
		}
		if err := tx.QueryRow(ctx, "UPDATE counter SET n = n + 1 RETURNING n").Scan(&n); err != nil {
			return stale, fmt.Errorf("update: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return stale, fmt.Errorf("commit: %w", err)
		}
		last = max(last, n)
		var found int64
		if err := r.QueryRow(ctx, "SELECT count(*) FROM t WHERE id = $1", id).Scan(&found); err != nil {
			return stale, fmt.Errorf("read the row: %w", err)
		}
		ro, err := r.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			return stale, fmt.Errorf("begin read only: %w", err)
		}
		var now int64
		if err := ro.QueryRow(ctx, "SELECT n FROM counter").Scan(&now); err != nil {
			return stale, fmt.Errorf("read the counter: %w", err)
		}
		if err := ro.Commit(ctx); err != nil {
			return stale, fmt.Errorf("commit read only: %w", err)
		}
		if found != 1 {
			stale++
		}
		if now < last {
			stale++
		}
		last = max(last, now)
	}
	return stale, nil
}

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: read-loop <writeDSN> <readDSN> <clients> <rounds>")
		os.Exit(2)
	}
	clients, _ := strconv.Atoi(os.Args[3])
	rounds, _ := strconv.Atoi(os.Args[4])
	ctx := context.Background()
	var mu sync.Mutex
	var wg sync.WaitGroup
	stale := 0
	var errs []error
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := client(ctx, os.Args[1], os.Args[2], rounds)
			mu.Lock()
			defer mu.Unlock()
			stale += s
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		for _, e := range errs {
			fmt.Printf("FAIL: %v\n", e)
		}
		os.Exit(1)
	}
	fmt.Printf("ok %d rounds %d stale\n", clients*rounds, stale)
}
