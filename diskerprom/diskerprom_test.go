package diskerprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskerprom"
	"github.com/diskerhq/disker/internal/redistest"
)

var redisURL string

func TestMain(m *testing.M) {
	srv, stop := redistest.MustStart()
	redisURL = srv.URL()
	code := m.Run()
	stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// gather returns the metrics of reg named disker_*, as
// `name{label="value",...}` -> value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "disker_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestRegisterTwice(t *testing.T) {
	c := diskerprom.New(diskerprom.Options{})
	other := diskerprom.New(diskerprom.Options{})
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry(), prometheus.NewRegistry()}
	regs[0].MustRegister(c)
	regs[1].MustRegister(c)
	regs[2].MustRegister(other)
	c.Observe(disker.Event{Kind: disker.EventSent, Receiver: "jobs"})
	for i, reg := range regs[:2] {
		if got := gather(t, reg)[`disker_messages_sent_total{receiver="jobs"}`]; got != 1 {
			t.Errorf("registry %d: sent = %v, want 1", i, got)
		}
	}
	if got, ok := gather(t, regs[2])[`disker_messages_sent_total{receiver="jobs"}`]; ok {
		t.Errorf("the other collector counts the first's sends: %v", got)
	}
	if err := regs[0].Register(c); err == nil {
		t.Error("registering the collector twice on one registry was not refused")
	}
}

// TestValuesEqualStats runs a known workload on a real redis-server and
// checks that the collector's values equal Stats and LocalStats.
func TestValuesEqualStats(t *testing.T) {
	c := diskerprom.New(diskerprom.Options{Receivers: []string{"backlog"}})
	all := diskerprom.New(diskerprom.Options{AllReceivers: true})
	d, err := disker.New(context.Background(), disker.Config{
		RedisURL: redisURL, KeyPrefix: redistest.Prefix(t), Logger: slog.New(slog.DiscardHandler),
		OnEvent: func(e disker.Event) { c.Observe(e); all.Observe(e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	c.Watch(d)
	all.Watch(d)
	reg, regAll := prometheus.NewRegistry(), prometheus.NewRegistry()
	reg.MustRegister(c)
	regAll.MustRegister(all)

	const ok, bad, waiting = 7, 3, 4
	err = d.Handle("jobs", disker.HandlerFunc(func(ctx context.Context, msg *disker.Message) ([]byte, error) {
		if string(msg.Content) == "bad" {
			return nil, disker.NoRetry(errors.New("bad content"))
		}
		return nil, nil
	}), disker.WithConcurrency(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	send := func(receiver, content string) {
		t.Helper()
		if _, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: []byte(content)}); err != nil {
			t.Fatal(err)
		}
	}
	for range ok {
		send("jobs", "ok")
	}
	for range bad {
		send("jobs", "bad")
	}
	for range waiting {
		send("backlog", "nobody serves me") // stays queued
	}
	if err := d.Pause(ctx, "backlog"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Send(ctx, disker.Message{Receiver: "backlog", Content: []byte("later")}, disker.WithDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Handled, and acknowledged: the acknowledgements are sent in
		// batches a moment after the handlers return.
		s := d.LocalStats().Receivers["jobs"]
		if st, err := d.Stats(ctx, "jobs"); err == nil && st.Pending == 0 && s.Processed == ok && s.DeadLettered == bad {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workload did not finish: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}

	local := d.LocalStats()
	js := local.Receivers["jobs"]
	want := map[string]float64{
		`disker_messages_sent_total{receiver="jobs"}`:                              ok + bad,
		`disker_messages_sent_total{receiver="backlog"}`:                           waiting + 1,
		`disker_messages_handled_total{receiver="jobs"}`:                           float64(js.Processed),
		`disker_messages_failed_total{receiver="jobs"}`:                            float64(js.Failed),
		`disker_messages_dead_lettered_total{receiver="jobs"}`:                     float64(js.DeadLettered),
		`disker_handler_duration_seconds{outcome="handled",receiver="jobs"}_count`: float64(js.Processed),
		`disker_in_flight{receiver="jobs"}`:                                        float64(js.InFlight),
		`disker_concurrency{receiver="jobs"}`:                                      float64(js.Concurrency),
		`disker_broker_up`:                                                         1,
		`disker_queue_stats_errors_total`:                                          0,
	}
	if sent := want[`disker_messages_sent_total{receiver="jobs"}`] + want[`disker_messages_sent_total{receiver="backlog"}`]; sent != float64(local.Sent) {
		t.Fatalf("sent %v, LocalStats.Sent %d", sent, local.Sent)
	}
	for _, r := range []string{"jobs", "backlog"} {
		s, err := d.Stats(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		want[fmt.Sprintf(`disker_queue_queued{receiver=%q}`, r)] = float64(s.Queued)
		want[fmt.Sprintf(`disker_queue_pending{receiver=%q}`, r)] = float64(s.Pending)
		want[fmt.Sprintf(`disker_queue_dead_letters{receiver=%q}`, r)] = float64(s.DeadLetters)
		want[fmt.Sprintf(`disker_queue_deferred{receiver=%q}`, r)] = float64(s.Deferred)
		want[fmt.Sprintf(`disker_queue_expired_total{receiver=%q}`, r)] = float64(s.Expired)
	}
	want[`disker_queue_paused{receiver="jobs"}`] = 0
	want[`disker_queue_paused{receiver="backlog"}`] = 1
	if want[`disker_queue_queued{receiver="backlog"}`] != waiting || want[`disker_queue_dead_letters{receiver="jobs"}`] != bad ||
		want[`disker_queue_deferred{receiver="backlog"}`] != 1 {
		t.Fatalf("Stats do not show the workload: %v", want)
	}
	for name, r := range map[string]*prometheus.Registry{"Receivers": reg, "AllReceivers": regAll} {
		got := gather(t, r)
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s: %s = %v (present: %v), want %v", name, k, g, ok, v)
			}
		}
	}
}
