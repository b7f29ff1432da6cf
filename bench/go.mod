module github.com/diskerhq/disker/bench

go 1.26.0

replace github.com/diskerhq/disker => ../

require (
	github.com/Jeffail/tunny v0.1.4
	github.com/alitto/pond/v2 v2.7.1
	github.com/diskerhq/disker v0.0.0-00010101000000-000000000000
	github.com/gammazero/workerpool v1.3.0
	github.com/hibiken/asynq v0.26.0
	github.com/jackc/puddle/v2 v2.2.3
	github.com/panjf2000/ants/v2 v2.12.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/sourcegraph/conc v0.3.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gammazero/deque v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/spf13/cast v1.10.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/multierr v1.9.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/time v0.14.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
