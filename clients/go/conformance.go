// The client conformance scenario with pgx (v4).
//
// Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE) as
// IDEM_APP_USER (two connections) and IDEM_WORKER_USER.  pgx prepares each
// statement and encodes each parameter as the type the server inferred: Go
// maps and structs become jsonb.  Prints one line per step and
// "pgx: N passed, M failed".  IDEM_PGBOUNCER=1: connected through PgBouncer
// in transaction mode (statement_cache_mode=describe).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgtype"
	"github.com/jackc/pgx/v4"
)

const (
	driver  = "pgx"
	scope   = "orders"
	key     = "order-1001"
	reserve = "SELECT outcome, http_status, response_code, response_body, response_headers," +
		" retry_after, lock_token FROM idem_reserve($1, $2, $3, $4)"
)

type order struct {
	Item     string  `json:"item"`
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
}

// reservation is the part of idempotency.reservation the scenario reads.
type reservation struct {
	Outcome         string
	HTTPStatus      *int32
	ResponseCode    *int32
	ResponseBody    map[string]interface{}
	ResponseHeaders map[string]string
	RetryAfter      *int32
	LockToken       pgtype.UUID
}

type queryer interface {
	QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row
}

func reserveKey(ctx context.Context, q queryer, tenant, key string, request interface{}) (reservation, error) {
	var r reservation
	err := q.QueryRow(ctx, reserve, tenant, scope, key, request).Scan(&r.Outcome, &r.HTTPStatus,
		&r.ResponseCode, &r.ResponseBody, &r.ResponseHeaders, &r.RetryAfter, &r.LockToken)
	return r, err
}

var passed, failed int

func step(name string, fn func() error) {
	if err := fn(); err != nil {
		failed++
		fmt.Printf("not ok - %s: %v\n", name, err)
		return
	}
	passed++
	fmt.Printf("ok - %s\n", name)
}

func expect(cond bool, what interface{}) error {
	if !cond {
		b, _ := json.Marshal(what)
		return fmt.Errorf("unexpected: %s", b)
	}
	return nil
}

func connect(ctx context.Context, user string) (*pgx.Conn, error) {
	conninfo := "user=" + user + " application_name=conformance-pgx"
	if os.Getenv("IDEM_PGBOUNCER") != "" {
		// PgBouncer (transaction mode) before 1.21: describe statements with
		// the unnamed statement instead of preparing named ones
		conninfo += " statement_cache_mode=describe"
	}
	return pgx.Connect(ctx, conninfo)
}

func run(ctx context.Context) error {
	tenant := fmt.Sprintf("conformance-pgx-%d-%d", os.Getpid(), time.Now().Unix())
	book := order{Item: "book", Amount: 12.5, Currency: "EUR"}

	app, err := connect(ctx, os.Getenv("IDEM_APP_USER"))
	if err != nil {
		return err
	}
	defer app.Close(ctx)
	other, err := connect(ctx, os.Getenv("IDEM_APP_USER"))
	if err != nil {
		return err
	}
	defer other.Close(ctx)
	worker, err := connect(ctx, os.Getenv("IDEM_WORKER_USER"))
	if err != nil {
		return err
	}
	defer worker.Close(ctx)

	var tx pgx.Tx
	step("reserve: created", func() error {
		if tx, err = app.Begin(ctx); err != nil {
			return err
		}
		r, err := reserveKey(ctx, tx, tenant, key, book)
		if err != nil {
			return err
		}
		return expect(r.Outcome == "created" && r.LockToken.Status == pgtype.Present &&
			r.HTTPStatus == nil, r)
	})

	step("concurrent duplicate: in_progress, retry_after", func() error {
		r, err := reserveKey(ctx, other, tenant, key, book)
		if err != nil {
			return err
		}
		return expect(r.Outcome == "in_progress" && r.HTTPStatus != nil && *r.HTTPStatus == 409 &&
			r.RetryAfter != nil && *r.RetryAfter > 0, r)
	})

	step("complete in the reserving transaction: succeeded", func() error {
		var status string
		err := tx.QueryRow(ctx, "SELECT idem_complete($1, $2, $3, $4, $5, $6)",
			tenant, scope, key, 201, map[string]int{"order_id": 1001},
			map[string]string{"Location": "/orders/1001"}).Scan(&status)
		if err != nil {
			tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		return expect(status == "succeeded", status)
	})

	step("replay, reordered and respaced body: stored response", func() error {
		body := `{ "currency":"EUR" ,  "amount" : 12.50, "item":"book" }`
		r, err := reserveKey(ctx, other, tenant, key, body)
		if err != nil {
			return err
		}
		return expect(r.Outcome == "replay" && *r.HTTPStatus == 201 && *r.ResponseCode == 201 &&
			r.ResponseBody["order_id"] == float64(1001) &&
			r.ResponseHeaders["Location"] == "/orders/1001", r)
	})

	step("different body: mismatch", func() error {
		changed := book
		changed.Amount = 13
		r, err := reserveKey(ctx, other, tenant, key, changed)
		if err != nil {
			return err
		}
		return expect(r.Outcome == "mismatch" && *r.HTTPStatus == 422, r)
	})

	var ids []int64
	step("outbox_enqueue with a reservation", func() error {
		return app.BeginFunc(ctx, func(tx pgx.Tx) error {
			r, err := reserveKey(ctx, tx, tenant, "order-1002", book)
			if err != nil {
				return err
			}
			if err := expect(r.Outcome == "created", r); err != nil {
				return err
			}
			for part := 1; part <= 2; part++ {
				var id int64
				err := tx.QueryRow(ctx, "SELECT outbox_enqueue($1, $2, $3, key => $4, scope => $5)",
					tenant, "payment.capture", map[string]int{"order": 1002, "part": part},
					"order-1002", scope).Scan(&id)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			_, err = tx.Exec(ctx, "SELECT idem_complete($1, $2, $3, $4, $5)",
				tenant, scope, "order-1002", 201, map[string]int{"order_id": 1002})
			if err != nil {
				return err
			}
			return expect(len(ids) == 2 && ids[0] != ids[1], ids)
		})
	})

	type claimedRow struct {
		ID         int64
		Key        string
		Payload    map[string]interface{}
		LeaseToken pgtype.UUID
	}
	var claimed []claimedRow
	step("outbox_claim as the worker", func() error {
		rows, err := worker.Query(ctx,
			"SELECT id, idem_key, payload, lease_token FROM outbox_claim($1, batch => 10, tenant => $2) ORDER BY id",
			"worker-pgx", tenant)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var row claimedRow
			if err := rows.Scan(&row.ID, &row.Key, &row.Payload, &row.LeaseToken); err != nil {
				return err
			}
			claimed = append(claimed, row)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return expect(len(claimed) == 2 && claimed[0].ID == ids[0] && claimed[1].ID == ids[1] &&
			claimed[0].Key == "order-1002" && claimed[0].LeaseToken.Status == pgtype.Present &&
			claimed[1].Payload["part"] == float64(2), claimed)
	})

	step("outbox_ack", func() error {
		if len(claimed) < 1 {
			return errors.New("nothing claimed")
		}
		_, err := worker.Exec(ctx, "SELECT outbox_ack($1, $2, $3, $4)",
			tenant, claimed[0].ID, claimed[0].LeaseToken, "ref-1")
		return err
	})

	step("outbox_nack: pending", func() error {
		if len(claimed) < 2 {
			return errors.New("nothing claimed")
		}
		var status string
		err := worker.QueryRow(ctx, "SELECT outbox_nack($1, $2, $3, $4)",
			tenant, claimed[1].ID, claimed[1].LeaseToken, "HTTP 503").Scan(&status)
		if err != nil {
			return err
		}
		return expect(status == "pending", status)
	})

	step("empty key: SQLSTATE 22004", func() error {
		_, err := reserveKey(ctx, other, tenant, "", book)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return fmt.Errorf("no database error: %v", err)
		}
		return expect(pgErr.Code == "22004", pgErr.Code)
	})
	return nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		failed++
		fmt.Printf("not ok - connection: %v\n", err)
	}
	fmt.Printf("%s: %d passed, %d failed\n", driver, passed, failed)
	if failed > 0 || passed == 0 {
		os.Exit(1)
	}
}
