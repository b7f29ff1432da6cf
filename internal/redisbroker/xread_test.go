package redisbroker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/redis/rueidis"
)

// xreadOf renders a read as asXRead answers it, for comparisons.
func xreadOf(read map[string][]xentry) string {
	var out []string
	for s, es := range read {
		out = append(out, s+": "+xentriesOf(es))
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}

func xentriesOf(es []xentry) string {
	var out []string
	for _, x := range es {
		if x.deleted {
			out = append(out, "deleted")
			continue
		}
		e := entry{fields: x.fields}
		m, _ := e.field("m")
		d, ok := e.field("d")
		out = append(out, fmt.Sprintf("m=%s d=%s/%v n=%d", m, d, ok, len(x.fields)))
	}
	return fmt.Sprint(out)
}

// TestAsXRead: asXRead and asXReadOf read the answers of XREADGROUP on
// RESP3 (a map of the streams) and on RESP2 (an array of pairs) alike,
// with a field given twice as its last value, an entry deleted since it
// was read as deleted, and nothing for a stream not read.
func TestAsXRead(t *testing.T) {
	ctx := ctxT(t)
	raw := rawClient(t, srv)
	a, b := t.Name()+":a", t.Name()+":b"
	for _, s := range []string{a, b} {
		do(t, raw, "XGROUP", "CREATE", s, "g", "0", "MKSTREAM")
	}
	do(t, raw, "XADD", a, "1-1", "m", "one")
	do(t, raw, "XADD", a, "2-1", "m", "x", "d", "7", "m", "two")
	do(t, raw, "XADD", b, "3-1", "m", "three")
	if err := raw.Do(ctx, raw.B().Xreadgroup().Group("g", "c").Streams().Key(a, b).Id(">", ">").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	do(t, raw, "XDEL", a, "1-1")
	want := fmt.Sprintf("[%s: [deleted m=two d=7/true n=6] %s: [m=three d=/false n=2]]", a, b)

	resp2, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, AlwaysRESP2: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp2.Close)
	for name, c := range map[string]rueidis.Client{"RESP3": raw, "RESP2": resp2} {
		// The pending entries of c: read again from id 0.
		pending := func() rueidis.RedisResult {
			return c.Do(ctx, c.B().Xreadgroup().Group("g", "c").Streams().Key(a, b).Id("0", "0").Build())
		}
		read, err := asXRead(pending())
		if got := xreadOf(read); err != nil || got != want {
			t.Errorf("%s: asXRead = %s, %v", name, got, err)
		}
		es, err := asXReadOf(pending(), b)
		if got := xentriesOf(es); err != nil || got != "[m=three d=/false n=2]" {
			t.Errorf("%s: asXReadOf(%s) = %s, %v", name, b, got, err)
		}
		es, err = asXReadOf(pending(), "other")
		if err != nil || es != nil {
			t.Errorf("%s: asXReadOf of a stream not read = %v, %v", name, es, err)
		}
		nothing := c.Do(ctx, c.B().Xread().Count(1).Block(1).Streams().Key(b).Id("$").Build())
		if _, err := asXReadOf(nothing, b); !rueidis.IsRedisNil(err) {
			t.Errorf("%s: asXReadOf of no answer: err %v, want a nil answer's", name, err)
		}
	}
}
