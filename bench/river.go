package bench

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// River, the Go job queue on PostgreSQL, runs fire-and-forget on the
// suite's private PostgreSQL (pgServer) with River's schema.

// riverImpl is River's row of fire-and-forget.
func riverImpl(pe *peers, n int) redisImpl {
	return redisImpl{name: nameRiver, peers: pe, server: func() (serverProbe, error) {
		pg, err := pe.riverDB()
		if err != nil {
			return nil, pe.missing(nameRiver, err)
		}
		return pg, nil
	}, run: func(ctx context.Context, _ *redisServer) (sample, error) {
		return ffRiver(ctx, pe, n)
	}}
}

// riverDB returns the suite's PostgreSQL with River's schema, starting it
// and migrating it on first use.
func (p *peers) riverDB() (*pgServer, error) {
	if p.pg != nil || p.pgErr != nil {
		return p.pg, p.pgErr
	}
	pg, err := startPostgres()
	if err == nil {
		if err = riverMigrate(pg.url()); err != nil {
			pg.close()
		}
	}
	if err != nil {
		p.pgErr = err
		return nil, err
	}
	p.pg = pg
	return pg, nil
}

// riverMigrate applies River's migrations to the database at url.
func riverMigrate(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	return nil
}

// riverArgs is the no-op job: the 16-byte payload.
type riverArgs struct {
	Data []byte `json:"data"`
}

// Kind names the job's kind.
func (riverArgs) Kind() string { return "bench_noop" }

// riverWorker counts each job it works.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	cd *countdown
}

// Work counts the job.
func (w *riverWorker) Work(context.Context, *river.Job[riverArgs]) error {
	w.cd.add()
	return nil
}

// River's fetch settings, those of River's own benchmark (riverbench),
// which it finds much faster than its defaults (100 ms and 1 s).
const (
	riverFetchCooldown     = 2 * time.Millisecond
	riverFetchPollInterval = 20 * time.Millisecond
)

// ffRiver runs fire-and-forget on River: ffProducers producers insert n
// jobs between them (Insert, one transaction each) through an insert-only
// client; a worker client, with ffHandlers workers on its queue, works
// them. Each client has a pool of its own, as two processes would; the
// producers' pool has a connection per producer. The jobs table is emptied
// and vacuumed before the run, as River's benchmark does.
func ffRiver(ctx context.Context, pe *peers, n int) (smp sample, err error) {
	pg, err := pe.riverDB()
	if err != nil {
		return sample{}, err
	}
	pcfg, err := pgxpool.ParseConfig(pg.url())
	if err != nil {
		return sample{}, err
	}
	pcfg.MaxConns = ffProducers
	ppool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return sample{}, err
	}
	defer ppool.Close()
	for _, q := range []string{"TRUNCATE river_job", "VACUUM FULL river_job"} {
		if _, err := ppool.Exec(ctx, q); err != nil {
			return sample{}, err
		}
	}
	wpool, err := pgxpool.New(ctx, pg.url())
	if err != nil {
		return sample{}, err
	}
	defer wpool.Close()

	quiet := slog.New(slog.DiscardHandler)
	producer, err := river.NewClient(riverpgxv5.New(ppool), &river.Config{Logger: quiet})
	if err != nil {
		return sample{}, err
	}
	cd := newCountdown(n)
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{cd: cd})
	worker, err := river.NewClient(riverpgxv5.New(wpool), &river.Config{
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: riverFetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: ffHandlers}},
		Workers:           workers,
		Logger:            quiet,
	})
	if err != nil {
		return sample{}, err
	}
	if err := worker.Start(ctx); err != nil {
		return sample{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		defer cancel()
		if serr := worker.Stop(sctx); err == nil {
			err = serr
		}
	}()
	errc := make(chan error, 1)
	return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(ctx context.Context) error {
			_, err := producer.Insert(ctx, riverArgs{Data: payload}, nil)
			return err
		})
	})
}
