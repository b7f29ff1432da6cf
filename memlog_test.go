package disker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestEmptyRedisURLIsLogged: an empty RedisURL selects the in-memory broker
// and says so in one log line, so that a missing variable in production is
// not silent; an explicit mem:// URL is a choice and logs nothing of it.
func TestEmptyRedisURLIsLogged(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]int{"": 1, "mem://memlog": 0} {
		var (
			mu  sync.Mutex
			buf bytes.Buffer
		)
		log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return buf.Write(p)
		}), nil))
		d, err := disker.New(context.Background(), disker.Config{RedisURL: url, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := strings.Count(buf.String(), "using the in-memory broker")
		mu.Unlock()
		if got != want {
			t.Errorf("RedisURL %q: %d log lines about the in-memory broker, want %d:\n%s", url, got, want, buf.String())
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestFailureAfterDeadlineIsNotAWarning: a handler that fails once its
// message's deadline has passed (the expected end of a slow handler) is
// logged at Debug, not as a warning, and counted as expired.
func TestFailureAfterDeadlineIsNotAWarning(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://" + t.Name(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	if err := d.Handle("slow", disker.HandlerFunc(func(ctx context.Context, _ *disker.Message) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := d.Request(ctx, disker.Message{Receiver: "slow"}); !errors.Is(err, disker.ErrTimeout) {
		t.Fatalf("Request = %v, want a timeout", err)
	}
	waitFor(t, 10*time.Second, "the delivery to be counted as expired", func() bool {
		return d.LocalStats().Receivers["slow"].Expired == 1
	})
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	const line = "handler failed after the message's deadline; dropped"
	if !strings.Contains(out, "level=DEBUG msg=\"disker: "+line) || strings.Contains(out, "level=WARN") {
		t.Fatalf("want %q at DEBUG and no warning; log:\n%s", line, out)
	}
}
