package disker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestConfigTLSConfig: a rediss:// server whose CA only Config.TLSConfig
// trusts is refused without it, and carries a request with it.
func TestConfigTLSConfig(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithTLS())
	if d, err := disker.New(context.Background(), disker.Config{RedisURL: srv.URL(), KeyPrefix: redistest.Prefix(t)}); err == nil {
		_ = d.Close(context.Background())
		t.Fatal("New without Config.TLSConfig trusted the test's CA")
	} else if !errors.Is(err, disker.ErrUnavailable) {
		t.Fatalf("New without Config.TLSConfig: %v, want ErrUnavailable", err)
	}
	d, err := disker.New(context.Background(), disker.Config{RedisURL: srv.URL(), KeyPrefix: redistest.Prefix(t), TLSConfig: srv.TLSConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	if err := d.Handle("echo", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		return m.Content, nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := d.Request(ctx, disker.Message{Receiver: "echo", Content: []byte("over TLS")})
	if err != nil || string(reply.Content) != "over TLS" {
		t.Fatalf("Request over TLS: %v, %v", reply, err)
	}
}
