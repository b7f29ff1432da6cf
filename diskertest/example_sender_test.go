package diskertest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskertest"
)

// signup is the code under test: it welcomes a new user by mail at once,
// and asks again a day later (the same user signing up twice in that day
// gets one reminder).
func signup(ctx context.Context, d *disker.Disker, email string) error {
	if _, err := d.Send(ctx, disker.Message{Receiver: "mail", Content: []byte("welcome " + email)}); err != nil {
		return err
	}
	_, err := d.Send(ctx, disker.Message{Receiver: "mail", Content: []byte("still there?")},
		disker.WithDelay(24*time.Hour), disker.WithDedupKey("reminder:"+email, 24*time.Hour))
	return err
}

// A test of a sender, and of time: what signup sent, and when the
// reminder goes. In a _test.go file it is func TestSignup(t *testing.T),
// with t.Parallel() and these lines, but for the two marked "example".
func Example_senderTest() {
	t := new(testing.T) // example: a test has its own t
	kit := diskertest.New(t)
	defer kit.Disker().Close(context.Background()) // example: in a test, t.Cleanup closes the kit

	if err := signup(context.Background(), kit.Disker(), "ann@example.com"); err != nil {
		t.Fatal(err)
	}
	kit.RequireSent("mail", diskertest.Content("welcome ann@example.com"))
	reminder := kit.RequireSent("mail", diskertest.Content("still there?"), diskertest.DueIn(24*time.Hour))
	kit.RequireNotSent("sms")

	fmt.Println("the reminder is due in", reminder.Due.Sub(kit.Now()))
	kit.Advance(24 * time.Hour)
	fmt.Println("then in", reminder.Due.Sub(kit.Now()))
	// Output:
	// the reminder is due in 24h0m0s
	// then in 0s
}
