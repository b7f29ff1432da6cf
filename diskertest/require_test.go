package diskertest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskertest"
)

// fakeT is a TB that keeps what the kit reports, for the tests of the
// kit's failures. Its Fatalf ends the goroutine, as testing's does.
type fakeT struct {
	mu       sync.Mutex
	fatal    string
	errors   []string
	cleanups []func()
}

// newFake returns a fakeT whose cleanups run when t ends; an Errorf made
// to it fails t.
func newFake(t *testing.T) *fakeT {
	f := &fakeT{}
	t.Cleanup(func() {
		for i := len(f.cleanups) - 1; i >= 0; i-- {
			f.cleanups[i]()
		}
		for _, e := range f.errors {
			t.Errorf("reported to the fake t: %s", e)
		}
	})
	return f
}

func (f *fakeT) Helper()             {}
func (f *fakeT) Logf(string, ...any) {}
func (f *fakeT) Cleanup(fn func())   { f.cleanups = append(f.cleanups, fn) }

func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// failure runs fn on a goroutine of its own and returns the message of
// the Fatalf that ended it, "" if none did.
func (f *fakeT) failure(fn func()) string {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	msg := f.fatal
	f.fatal = ""
	return msg
}

// wantFailure fails t unless fn fails f with a message that contains
// every one of want.
func wantFailure(t *testing.T, f *fakeT, fn func(), want ...string) {
	t.Helper()
	msg := f.failure(fn)
	if msg == "" {
		t.Fatalf("no failure, want one containing %q", want)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("the failure does not contain %q:\n%s", w, msg)
		}
	}
	t.Logf("the failure, as a test shows it:\n%s", msg)
}

func TestRequireSentShowsTheDifference(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	kit := diskertest.New(f)
	ctx := context.Background()
	d := kit.Disker()
	if _, err := d.Send(ctx, disker.Message{Receiver: "mail", Content: []byte("welcome bob"), Headers: map[string]string{"lang": "fr"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Send(ctx, disker.Message{Receiver: "sms", Content: []byte(`{"to":"ann","text":"hi"}`)}); err != nil {
		t.Fatal(err)
	}

	wantFailure(t, f, func() { kit.RequireSent("mail", diskertest.Content("welcome ann"), diskertest.Header("lang", "fr")) },
		`RequireSent: no message sent to "mail" matches:`,
		`Content: "welcome ann"`,
		`1 message sent to "mail" (-want +got):`,
		`Content: -"welcome ann" +"welcome bob"`)
	wantFailure(t, f, func() { kit.RequireSent("mail", diskertest.Header("lang", "en"), diskertest.DueIn(time.Hour)) },
		`Header "lang": -"en" +"fr"`,
		`Due: -in 1h0m0s +in 0s`)
	wantFailure(t, f, func() { kit.RequireSent("mailer") },
		`no message sent to "mailer" matches: none was sent to it (messages were sent to "mail" (1), "sms" (1))`)
	wantFailure(t, f, func() { kit.RequireSent("sms", diskertest.ContentJSON(`{"text": "hi", "to": "bob"}`)) },
		"Content (JSON):",
		`-   "to": "bob"`,
		`+   "to": "ann"`,
		`    "text": "hi",`)
	wantFailure(t, f, func() { kit.RequireSent("sms", diskertest.ContentJSON(`{"to":`)) },
		"invalid JSON in ContentJSON")
	wantFailure(t, f, func() { kit.RequireNotSent("mail", diskertest.Header("lang", "fr")) },
		`RequireNotSent: a message sent to "mail" matches:`, `content "welcome bob"`)

	// The matches that hold pass, and return the message.
	s := kit.RequireSent("sms", diskertest.ContentJSON(`{"text": "hi", "to": "ann"}`), diskertest.Sender(""), diskertest.DueIn(0))
	if !s.At.Equal(kit.Now()) || !s.Due.Equal(s.At) || s.Request || s.Schedule != "" {
		t.Fatalf("RequireSent returned %+v", s)
	}
	kit.RequireNotSent("mail", diskertest.Content("welcome ann"))
}

func TestRequireFailuresOfTheOtherKinds(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	kit := diskertest.New(f)
	d := kit.Disker()
	if err := d.Handle("r", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		return nil, disker.NoRetry(errors.New("no such image"))
	})); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, f, func() { kit.RequireReply("web") }, `no reply to "web" matches: none was accepted for it`)
	wantFailure(t, f, func() { kit.RequireDeadLetter("r") }, `no dead letter of "r" matches: it has none`)
	wantFailure(t, f, func() { kit.RequireDelivered("r") }, `Drain ran none`)
	if _, err := d.Send(context.Background(), disker.Message{Sender: "web", Receiver: "r", Content: []byte("cat.png")}); err != nil {
		t.Fatal(err)
	}
	kit.Drain()
	wantFailure(t, f, func() { kit.RequireReply("web", diskertest.ErrorCode(disker.CodeExpired)) },
		`Error.Code: -"expired" +"dead_letter" (no such image)`)
	wantFailure(t, f, func() { kit.RequireDeadLetter("r", diskertest.Reason("timeout"), diskertest.Attempt(2)) },
		`1 dead letter of "r" (-want +got):`,
		`Reason: -containing "timeout" +"attempt 1 failed with an error marked NoRetry: no such image"`,
		`Attempt: -2 +1`)
	wantFailure(t, f, func() { kit.RequireDelivered("r", diskertest.Ended(diskertest.Handled)) },
		`Outcome: -handled +dead-lettered (no such image)`)
	wantFailure(t, f, func() { kit.RequireReply("web", diskertest.Timeout(time.Second)) },
		`Timeout: -1s +(not a message sent)`)
	wantFailure(t, f, func() {
		kit.RequireSent("r", diskertest.Where("a PNG under 5 bytes", func(m disker.Message) bool { return len(m.Content) < 5 }))
	}, `Where: -a PNG under 5 bytes +not a PNG under 5 bytes`)
	kit.RequireDelivered("r", diskertest.Ended(diskertest.DeadLettered), diskertest.Attempt(1))
}

func TestKitMisuseFailsTheTest(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	wantFailure(t, f, func() { diskertest.New(f, diskertest.WithConfig(disker.Config{RedisURL: "redis://localhost:6379"})) },
		"Config.RedisURL is redis://localhost:6379")
	wantFailure(t, f, func() { diskertest.New(f, diskertest.WithStart(time.Time{})) }, "the zero time is not a start")
	wantFailure(t, f, func() { diskertest.New(f, diskertest.WithConfig(disker.Config{MaxMessageSize: -1})) }, "Config.MaxMessageSize")

	kit := diskertest.New(f)
	d := kit.Disker()
	if err := d.Handle("r", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		_, err := d.Send(ctx, disker.Message{Receiver: "r"}) // again, for ever
		return nil, err
	})); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, f, func() { kit.Drain("nobody") }, `Drain("nobody"): neither a receiver the kit's Disker serves (Handle: "r") nor a sender it has handlers for (OnReply, OnTimeout: none)`)
	wantFailure(t, f, func() { kit.Advance(-time.Second) }, "the clock does not go back")
	if _, err := d.Send(context.Background(), disker.Message{Receiver: "r"}); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, f, func() { kit.Drain() }, "more than 10000 deliveries and replies")
}

func TestLineDiff(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	kit := diskertest.New(f)
	long := strings.Repeat("a", 200)
	lines := func(n int, change string) string {
		var b strings.Builder
		for i := range n {
			if i == n/2 && change != "" {
				b.WriteString(change + "\n")
				continue
			}
			fmt.Fprintf(&b, "line %d\n", i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name, want, got string
		in, out         []string
	}{
		{"one-line-changed", lines(5, ""), lines(5, "changed"),
			[]string{"  line 1", "- line 2", "+ changed", "  line 3"}, nil},
		{"equal-lines-cut", lines(20, ""), lines(20, "changed"),
			[]string{"  line 0", "  ...", "  line 9", "- line 10", "+ changed", "  line 11"}, []string{"line 5\n"}},
		{"line-added", "a\nb", "a\nx\nb", []string{"  a", "+ x", "  b"}, nil},
		{"line-removed", "a\nx\nb", "a\nb", []string{"  a", "- x", "  b"}, nil},
		{"long-one-line-texts", long + "b", long + "c", []string{"first difference at byte 200"}, nil},
	} {
		if _, err := kit.Disker().Send(context.Background(), disker.Message{Receiver: tc.name, Content: []byte(tc.got)}); err != nil {
			t.Fatal(err)
		}
		msg := f.failure(func() { kit.RequireSent(tc.name, diskertest.Content(tc.want)) })
		for _, w := range tc.in {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: the failure does not contain %q:\n%s", tc.name, w, msg)
			}
		}
		for _, w := range tc.out {
			if strings.Contains(msg, w) {
				t.Errorf("%s: the failure contains %q:\n%s", tc.name, w, msg)
			}
		}
	}
}
