package disker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/diskerhq/disker"
)

// RequestStream yields the handler's partial replies as they come, then
// the final reply: here a handler that sends a text word by word.
func ExampleDisker_RequestStream() {
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example-stream"})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	err = d.Handle("words", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		words := strings.Fields(string(m.Content))
		for _, w := range words {
			if err := m.Partial(ctx, []byte(w)); err != nil {
				return nil, err
			}
		}
		return fmt.Appendf(nil, "%d words", len(words)), nil
	}))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for part, err := range d.RequestStream(ctx, disker.Message{Receiver: "words", Content: []byte("one two three")}) {
		switch {
		case err != nil:
			fmt.Println("error:", err)
		case part.Reply != nil:
			fmt.Println("final:", string(part.Reply.Content))
		default:
			fmt.Println("partial:", string(part.Content), "attempt", part.Attempt)
		}
	}
	// Output:
	// partial: one attempt 1
	// partial: two attempt 1
	// partial: three attempt 1
	// final: 3 words
}

// A handler that serves Request and RequestStream alike streams only to
// the callers that read partial replies (Streamed), and replies with the
// whole to the others.
func ExampleMessage_Streamed() {
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example-streamed"})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	err = d.Handle("report", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		rows := []string{"a,1", "b,2"}
		if !m.Streamed() {
			return []byte(strings.Join(rows, "\n")), nil
		}
		for _, r := range rows {
			if err := m.Partial(ctx, []byte(r)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := d.Request(ctx, disker.Message{Receiver: "report"})
	if err != nil {
		panic(err)
	}
	fmt.Printf("Request: %q\n", r.Content)
	for part, err := range d.RequestStream(ctx, disker.Message{Receiver: "report"}) {
		if err != nil {
			panic(err)
		}
		if part.Reply == nil {
			fmt.Printf("RequestStream: %q\n", part.Content)
		}
	}
	// Output:
	// Request: "a,1\nb,2"
	// RequestStream: "a,1"
	// RequestStream: "b,2"
}

// Partial is refused once the request has its final outcome: here after
// the handler replied with Reply.
func ExampleMessage_Partial() {
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example-partial"})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	late := make(chan error, 1)
	err = d.Handle("answer", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if err := m.Partial(ctx, []byte("thinking")); err != nil {
			return nil, err
		}
		if err := d.Reply(ctx, m, []byte("42")); err != nil {
			return nil, err
		}
		late <- m.Partial(ctx, []byte("more"))
		return nil, disker.ErrReplyLater
	}))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for part, err := range d.RequestStream(ctx, disker.Message{Receiver: "answer"}) {
		if err != nil {
			panic(err)
		}
		if part.Reply != nil {
			fmt.Println("final:", string(part.Reply.Content))
		} else {
			fmt.Println("partial:", string(part.Content))
		}
	}
	fmt.Println(errors.Is(<-late, disker.ErrLate))
	// Output:
	// partial: thinking
	// final: 42
	// true
}
