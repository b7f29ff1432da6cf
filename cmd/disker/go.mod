module github.com/diskerhq/disker/cmd/disker

go 1.26.0

require (
	github.com/diskerhq/disker v0.0.0-00010101000000-000000000000
	github.com/diskerhq/disker/internal/cli v0.0.0-00010101000000-000000000000
	github.com/redis/rueidis v1.0.79
	go.uber.org/goleak v1.3.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/diskerhq/disker/diskerprom v0.0.0-00010101000000-000000000000 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/term v0.46.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/diskerhq/disker => ../..
	github.com/diskerhq/disker/diskerprom => ../../diskerprom
	github.com/diskerhq/disker/internal/cli => ../../internal/cli
)
