module github.com/diskerhq/disker

go 1.26.0

require (
	github.com/redis/rueidis v1.0.79
	github.com/robfig/cron/v3 v3.0.1
	go.uber.org/goleak v1.3.0
)

require golang.org/x/sys v0.48.0 // indirect
