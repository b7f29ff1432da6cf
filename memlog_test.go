package disker_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

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
