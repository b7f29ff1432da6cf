package diskertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskertest"
)

// resize is the handler under test: for "cat.png 64x64" it replies with
// the name of the thumbnail, "cat-64x64.png"; a request without a size
// can never succeed, so it is not retried.
func resize(_ context.Context, m *disker.Message) ([]byte, error) {
	name, size, ok := strings.Cut(string(m.Content), " ")
	if !ok {
		return nil, disker.NoRetry(errors.New("no size"))
	}
	return []byte(strings.TrimSuffix(name, ".png") + "-" + size + ".png"), nil
}

// A test of a handler: it sends two messages, runs the handler on them,
// and asserts its reply and its dead letter. In a _test.go file it is
// func TestResize(t *testing.T), with t.Parallel() and these lines, but
// for the two marked "example".
func Example_handlerTest() {
	t := new(testing.T) // example: a test has its own t
	kit := diskertest.New(t)
	defer kit.Disker().Close(context.Background()) // example: in a test, t.Cleanup closes the kit
	d := kit.Disker()
	if err := d.Handle("resize", disker.HandlerFunc(resize)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d.Send(ctx, disker.Message{Sender: "web", Receiver: "resize", Content: []byte("cat.png 64x64")})
	d.Send(ctx, disker.Message{Sender: "web", Receiver: "resize", Content: []byte("dog.png")})
	for _, dv := range kit.Drain() {
		fmt.Printf("%s: %v\n", dv.Message.Content, dv.Outcome)
	}
	kit.RequireReply("web", diskertest.Content("cat-64x64.png"))
	kit.RequireDeadLetter("resize", diskertest.Content("dog.png"), diskertest.Reason("no size"))
	// Output:
	// cat.png 64x64: handled
	// dog.png: dead-lettered
}
