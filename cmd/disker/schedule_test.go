package main_test

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/wire"
)

// TestScheduleCommands: disker schedule add stores a schedule that three
// worker processes (of another receiver) run, each tick once, also after
// one of them is killed with SIGKILL; schedules lists it; remove stops it.
func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var workers []*proc
	for range 3 {
		workers = append(workers, e.startWorker("--receiver", "other", "--exec", "cat"))
	}
	out, errOut, code := e.run("", "schedule", "add", "tick", "--receiver", "ticks", "--every", "100ms", "--header", "k=v", "hello")
	if code != 0 || !strings.Contains(out, "schedule tick: every 100ms to ticks, next at ") {
		t.Fatalf("schedule add: exit %d, %q %s", code, out, errOut)
	}
	// Nobody serves "ticks": its messages wait in its queue, where the test
	// reads them.
	rc, err := rueidis.NewClient(rueidis.MustParseURL(e.redisURL))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	queue := e.prefix + ":{ticks}:q"
	queued := func() int64 {
		n, _ := rc.Do(context.Background(), rc.B().Xlen().Key(queue).Build()).AsInt64()
		return n
	}
	waitFor(t, 60*time.Second, "20 ticks", func() bool { return queued() >= 20 })
	workers[1].signal(syscall.SIGKILL)
	<-workers[1].done
	before := queued()
	waitFor(t, 60*time.Second, "20 more ticks", func() bool { return queued() >= before+20 })

	out, _, code = e.run("", "schedules")
	if code != 0 || !strings.Contains(out, "NAME") || len(strings.Fields(out)) < 14 || !slices.Equal(strings.Fields(out)[7:11], []string{"tick", "ticks", "every", "100ms"}) || !strings.Contains(out, `"hello"`) {
		t.Errorf("schedules: exit %d\n%s", code, out)
	}
	out, errOut, code = e.run("", "schedule", "remove", "tick", "nothing")
	if code != 1 || out != "removed schedule tick\n" || !strings.Contains(errOut, "no schedule named nothing") {
		t.Errorf("schedule remove tick nothing: exit %d, %q %s", code, out, errOut)
	}
	if out, _, code := e.run("", "schedule", "list"); code != 0 || out != "No schedules.\n" {
		t.Errorf("schedule list after remove: exit %d, %q", code, out)
	}

	entries, err := rc.Do(context.Background(), rc.B().Xrange().Key(queue).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatal(err)
	}
	var ticks []time.Time
	for _, en := range entries {
		env, err := wire.Decode([]byte(en.FieldValues["m"]))
		if err != nil {
			t.Fatal(err)
		}
		if string(env.Content) != "hello" || env.Headers["k"] != "v" || env.Headers[disker.HeaderSchedule] != "tick" {
			t.Fatalf("a tick's message: %+v", env)
		}
		tk, err := time.Parse(disker.TickTimeFormat, env.Headers[disker.HeaderTick])
		if err != nil {
			t.Fatal(err)
		}
		ticks = append(ticks, tk)
	}
	slices.SortFunc(ticks, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(ticks); i++ {
		if gap := ticks[i].Sub(ticks[i-1]); gap != 100*time.Millisecond {
			t.Errorf("ticks %v and %v: %v apart, want 100ms (each tick once)", ticks[i-1], ticks[i], gap)
		}
	}
	t.Logf("%d ticks, each once, one of three workers killed", len(ticks))
}

// TestScheduleCommandErrors: a bad schedule is exit 2 and names the flag,
// before any connection to Redis.
func TestScheduleCommandErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.redisURL = "redis://127.0.0.1:1/0" // nothing there: the checks come first
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"schedule", "add", "s", "--every", "1s"}, "--receiver is required"},
		{[]string{"schedule", "add", "s", "--receiver", "r"}, "give --every or --cron"},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--every", "1s", "--cron", "* * * * *"}, "not both"},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--cron", "0 25 * * *"}, `invalid --cron: "0 25 * * *" does not parse: field 2 (hour) "25" at column 3`},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--every", "1ms"}, "invalid --every"},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--every", "1s", "--tz", "Europe/Paris"}, "--tz needs --cron"},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--cron", "@daily", "--tz", "Mars/Olympus"}, `invalid --tz "Mars/Olympus"`},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--every", "1s", "--missed", "all"}, `invalid --missed "all"`},
		{[]string{"schedule", "add", "a b", "--receiver", "r", "--every", "1s"}, `invalid NAME: "a b"`},
		{[]string{"schedule", "add", "s", "--receiver", "_r", "--every", "1s"}, `invalid --receiver "_r"`},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--every", "1s", "--header", "novalue"}, `invalid --header "novalue"`},
		{[]string{"schedule", "remove", "a b"}, `invalid NAME "a b"`},
		{[]string{"schedule", "remove"}, "schedule remove needs at least one NAME"},
	} {
		_, errOut, code := e.run("", c.args...)
		said := withoutLogs(errOut)
		if code != 2 || !strings.Contains(said, c.want) || strings.Count(said, "\n") != 1 {
			t.Errorf("disker %v: exit %d, stderr %q; want exit 2 and one line with %q", c.args, code, said, c.want)
		}
	}
}
