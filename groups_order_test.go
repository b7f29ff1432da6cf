package disker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// An orderLog is the test's own record of the starts and ends of keyed
// messages, in a Redis server of its own (not the broker's), where each
// start and end is one script: handlers in any number of processes record
// into it in the order things happened. A message's content is "<key>
// <seq>", seq its place in its key's send order from 0; a handler runs
// start before its work and end after it, with the id of its process.
//
// The checks, made at each start (violations are listed in the log), for
// keys run at most n at a time:
//   - a message starts only while fewer than n earlier messages of its key
//     are unfinished: with n = 1, after its key's previous message
//     finished (it may be the last finished itself, delivered again
//     because its worker died before acknowledging it);
//   - with n = 1, a message's first start comes after its key's previous
//     message's first start (a first delivery whose process died before
//     it recorded its start does not count), and is its only first
//     delivery;
//   - no more than n of a key's messages run at once, counting only the
//     handlers of processes still alive (the test tells the log which it
//     killed).
type orderLog struct {
	rc     rueidis.Client
	prefix string
	n      int
}

// newOrderLog starts the record's Redis server and returns the log, for
// keys run at most n at a time.
func newOrderLog(t *testing.T, n int) (*orderLog, string) {
	t.Helper()
	s := redistest.Start(t)
	l, err := openOrderLog(s.URL(), "order", n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.rc.Close)
	return l, s.URL()
}

func openOrderLog(url, prefix string, n int) (*orderLog, error) {
	rc, err := rueidis.NewClient(rueidis.MustParseURL(url))
	if err != nil {
		return nil, err
	}
	return &orderLog{rc: rc, prefix: prefix, n: n}, nil
}

func (l *orderLog) keys() []string {
	p := l.prefix + ":"
	return []string{p + "finished", p + "started", p + "running", p + "dead", p + "bad", p + "done"}
}

// logStart records a start; see orderLog.
var logStart = rueidis.NewLuaScript(`
local finished, started, running, dead, bad, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local key, seq, attempt, proc, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local function fail(what) redis.call('RPUSH', bad, key .. ' ' .. seq .. ' (attempt ' .. attempt .. ' in ' .. proc .. '): ' .. what) end
local f = tonumber(redis.call('HGET', finished, key) or '-1')
local s = tonumber(redis.call('HGET', started, key) or '-1')
if seq > s then
  if n == 1 and seq > s + 1 then fail('started before ' .. (s + 1) .. ', an earlier message of its key') end
  redis.call('HSET', started, key, seq)
elseif attempt == 1 and n == 1 then
  fail('delivered a first time after ' .. s .. ' started')
end
local unfinished = {}
for j = f + 1, seq - 1 do
  if redis.call('SISMEMBER', done, key .. ' ' .. j) == 0 then unfinished[#unfinished + 1] = j end
end
if #unfinished > n - 1 then
  fail('started while ' .. #unfinished .. ' earlier messages of its key were not finished: ' .. table.concat(unfinished, ' '))
end
local live, kept = 0, {}
for tok in string.gmatch(redis.call('HGET', running, key) or '', '%S+') do
  local p = string.match(tok, '^([^/]+)/')
  if redis.call('SISMEMBER', dead, p) == 0 then
    live = live + 1
    kept[#kept + 1] = tok
  end
end
if live + 1 > n then fail((live + 1) .. ' running at once: ' .. table.concat(kept, ' ')) end
kept[#kept + 1] = proc .. '/' .. seq
redis.call('HSET', running, key, table.concat(kept, ' '))
return 1
`)

// logEnd records an end; see orderLog.
var logEnd = rueidis.NewLuaScript(`
local finished, running, done = KEYS[1], KEYS[3], KEYS[6]
local key, seq, proc = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local kept, me = {}, proc .. '/' .. seq
for tok in string.gmatch(redis.call('HGET', running, key) or '', '%S+') do
  if tok ~= me then kept[#kept + 1] = tok end
end
redis.call('HSET', running, key, table.concat(kept, ' '))
redis.call('SADD', done, key .. ' ' .. seq)
local f = tonumber(redis.call('HGET', finished, key) or '-1')
while redis.call('SISMEMBER', done, key .. ' ' .. (f + 1)) == 1 do f = f + 1 end
redis.call('HSET', finished, key, f)
return 1
`)

// handler returns the handler that records its messages in l as process
// proc, working for work.
func (l *orderLog) handler(proc string, work time.Duration) disker.Handler {
	return disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		key, seq, ok := strings.Cut(string(m.Content), " ")
		if !ok || m.Group != key {
			return nil, fmt.Errorf("message %q of group %q", m.Content, m.Group)
		}
		if err := logStart.Exec(ctx, l.rc, l.keys(), []string{key, seq, strconv.Itoa(m.Attempt), proc, strconv.Itoa(l.n)}).Error(); err != nil {
			return nil, err
		}
		time.Sleep(work)
		return nil, logEnd.Exec(ctx, l.rc, l.keys(), []string{key, seq, proc}).Error()
	})
}

// killed tells the log that process proc is dead.
func (l *orderLog) killed(t *testing.T, proc string) {
	t.Helper()
	if err := l.rc.Do(context.Background(), l.rc.B().Sadd().Key(l.keys()[3]).Member(proc).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// done returns how many messages finished (each counted once).
func (l *orderLog) done(t *testing.T) int64 {
	t.Helper()
	n, err := l.rc.Do(context.Background(), l.rc.B().Scard().Key(l.keys()[5]).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// check fails t with the violations the log found.
func (l *orderLog) check(t *testing.T) {
	t.Helper()
	bad, err := l.rc.Do(context.Background(), l.rc.B().Lrange().Key(l.keys()[4]).Start(0).Stop(99).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("%d violations of the keys' order, the first:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// keyedMessages returns keys × each messages of receiver, "k<i> <seq>" in
// group "k<i>", in send order (seq by seq across the keys).
func keyedMessages(receiver string, keys, each int) []disker.Outgoing {
	out := make([]disker.Outgoing, 0, keys*each)
	for seq := range each {
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			out = append(out, disker.Outgoing{
				Message: disker.Message{Receiver: receiver, Content: []byte(key + " " + strconv.Itoa(seq))},
				Options: []disker.SendOption{disker.WithGroup(key)},
			})
		}
	}
	return out
}

// runKeyedChild is the child "keyed": it serves DISKER_TEST_RECEIVER with
// concurrency 16 and group concurrency DISKER_TEST_N, recording in the
// order log at DISKER_TEST_LOG_URL as process DISKER_TEST_PROC.
func runKeyedChild(d *disker.Disker) int {
	n, _ := strconv.Atoi(os.Getenv("DISKER_TEST_N"))
	l, err := openOrderLog(os.Getenv("DISKER_TEST_LOG_URL"), "order", n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	err = d.Handle(os.Getenv("DISKER_TEST_RECEIVER"), l.handler(os.Getenv("DISKER_TEST_PROC"), time.Millisecond),
		disker.WithConcurrency(16), disker.WithGroupConcurrency(n), disker.WithLease(childLease), disker.WithMaxAttempts(1000))
	return childServes(err)
}

// TestGroupsKilledWorkers sends 1,000 keys × 50 messages to three worker
// processes (concurrency 16 each) and kills one at random with SIGKILL
// every few hundred milliseconds, starting another in its place: for
// every key, messages start in send order, one at a time (a message whose
// worker died starts again, before the next), or at most three at a time
// with WithGroupConcurrency(3); every message is handled; nothing is left.
func TestGroupsKilledWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("a multi-process test: runs without -short")
	}
	keys, each := 1000, 50
	if raceOn {
		keys, each = 200, 20
	}
	for _, n := range []int{1, 3} {
		t.Run("n="+strconv.Itoa(n), func(t *testing.T) {
			t.Parallel()
			l, logURL := newOrderLog(t, n)
			e := newEnv(t, true, redisURL(t))
			procs := 0
			start := func() *child {
				procs++
				c := startChild(t, e, "keyed", "keyed", "", "DISKER_TEST_N="+strconv.Itoa(n),
					"DISKER_TEST_LOG_URL="+logURL, "DISKER_TEST_PROC=p"+strconv.Itoa(procs))
				if line := recv(t, c.lines, 30*time.Second, "a child to be ready"); line != "ready" {
					t.Fatalf("child said %q, want ready", line)
				}
				return c
			}
			cs := []*child{start(), start(), start()}
			names := []string{"p1", "p2", "p3"}
			d := e.open()
			msgs := keyedMessages("keyed", keys, each)
			if _, err := d.SendEach(ctxTimeout(t, time.Minute), msgs); err != nil {
				t.Fatal(err)
			}
			total, kills := int64(len(msgs)), 0
			began := time.Now()
			for l.done(t) < total {
				if time.Since(began) > 5*time.Minute {
					t.Fatalf("%d of %d messages handled after %v", l.done(t), total, time.Since(began))
				}
				time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
				if kills < 20 && l.done(t) < total*9/10 {
					i := rand.IntN(len(cs))
					cs[i].kill(t)
					l.killed(t, names[i])
					kills++
					cs[i], names[i] = start(), "p"+strconv.Itoa(procs)
				}
			}
			t.Logf("%d keys × %d messages, group concurrency %d, 3 processes × 16: handled in %v with %d workers killed", keys, each, n, time.Since(began).Round(time.Millisecond), kills)
			l.check(t)
			waitFor(t, 30*time.Second, "the queue drained", func() bool {
				st, err := d.Stats(context.Background(), "keyed")
				return err == nil && st.Length == 0 && st.GroupWaiting == 0 && st.DeadLetters == 0
			})
		})
	}
}
