package disker_test

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// Schedule registers a periodic schedule in the broker: each tick sends
// one message to the receiver, once across all instances that run
// schedules (every instance that serves a receiver or registered one).
// Every instance may register the same schedule at start: registering it
// again changes nothing.
func ExampleDisker_Schedule() {
	d := openExample("example-schedule", disker.Config{})
	defer d.Close(context.Background())

	ticks := make(chan *disker.Message, 100)
	_ = d.Handle("reports", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		ticks <- m
		return nil, nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.Schedule(ctx, disker.Schedule{
		Name:     "daily-report",
		Receiver: "reports",
		Content:  []byte(`{"report":"daily"}`),
		Every:    50 * time.Millisecond, // or Cron: "0 9 * * 1-5", Location: paris
		Missed:   disker.MissedOne,      // one message for ticks missed while nothing ran
	})
	if err != nil {
		panic(err)
	}
	m := <-ticks
	fmt.Println(string(m.Content), m.Headers[disker.HeaderSchedule])

	infos, _ := d.Schedules(ctx)
	fmt.Println(infos[0].Name, infos[0].Spec(), infos[0].Missed)

	removed, _ := d.RemoveSchedule(ctx, "daily-report")
	fmt.Println("removed:", removed)

	_, err = time.Parse(disker.TickTimeFormat, m.Headers[disker.HeaderTick])
	fmt.Println("tick time parses:", err == nil)
	// Output:
	// {"report":"daily"} daily-report
	// daily-report every 50ms one
	// removed: true
	// tick time parses: true
}

// Schedules lists the schedules stored in the broker, with their next and
// last ticks (the broker's clock).
func ExampleDisker_Schedules() {
	d := openExample("example-schedules", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	_ = d.Schedule(ctx, disker.Schedule{Name: "nightly", Receiver: "cleanup", Cron: "30 2 * * *"})
	_ = d.Schedule(ctx, disker.Schedule{Name: "ping", Receiver: "health", Every: time.Minute})

	infos, err := d.Schedules(ctx)
	if err != nil {
		panic(err)
	}
	for _, s := range infos {
		fmt.Printf("%s -> %s, %s, next in the future: %v, ticked before: %v\n",
			s.Name, s.Receiver, s.Spec(), s.Next.After(time.Now().Add(-time.Second)), !s.LastTick.IsZero())
	}
	// Output:
	// nightly -> cleanup, 30 2 * * *, next in the future: true, ticked before: false
	// ping -> health, every 1m0s, next in the future: true, ticked before: false
}

// RemoveSchedule stops a schedule on every instance; it reports whether
// there was one.
func ExampleDisker_RemoveSchedule() {
	d := openExample("example-remove-schedule", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	_ = d.Schedule(ctx, disker.Schedule{Name: "ping", Receiver: "health", Every: time.Minute})

	removed, err := d.RemoveSchedule(ctx, "ping")
	fmt.Println(removed, err)
	removed, err = d.RemoveSchedule(ctx, "ping")
	fmt.Println(removed, err)
	// Output:
	// true <nil>
	// false <nil>
}

// Validate checks a schedule without a broker: a cron expression that
// does not parse is named, with the field at fault.
func ExampleSchedule_Validate() {
	s := disker.Schedule{Name: "report", Receiver: "reports", Cron: "0 25 * * *"}
	fmt.Println(s.Validate())
	// Output:
	// disker: invalid Schedule.Cron: "0 25 * * *" does not parse: field 2 (hour) "25" at column 3: end of range (25) above maximum (23): 25
}

// Spec shows a schedule's timing as text.
func ExampleSchedule_Spec() {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		paris = time.FixedZone("Europe/Paris", 3600) // no time zone database here
	}
	every := disker.Schedule{Every: 90 * time.Second}
	cron := disker.Schedule{Cron: "0 9 * * 1-5", Location: paris}
	fmt.Println(every.Spec())
	fmt.Println(cron.Spec())
	// Output:
	// every 1m30s
	// 0 9 * * 1-5 (Europe/Paris)
}

// ParseMissed reads the name of a Missed option, as Missed.String writes
// it (the --missed flag of `disker schedule add`).
func ExampleParseMissed() {
	m, err := disker.ParseMissed("one")
	fmt.Println(m == disker.MissedOne, err)
	_, err = disker.ParseMissed("all")
	fmt.Println(err)
	// Output:
	// true <nil>
	// disker: invalid Schedule.Missed: "all" is neither "skip" nor "one"
}

// String names a Missed option.
func ExampleMissed_String() {
	fmt.Println(disker.MissedSkip, disker.MissedOne)
	// Output:
	// skip one
}
