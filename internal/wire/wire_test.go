package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func sample() broker.Envelope {
	return broker.Envelope{
		ID:        "01J9Z6T0000000000000000000",
		Sender:    "web",
		Receiver:  "orders",
		Content:   []byte("hello\x00world"),
		Headers:   map[string]string{"b": "2", "a": "1", "": "empty key"},
		Route:     broker.RouteInbox,
		Timeout:   1500 * time.Millisecond,
		InReplyTo: "req-1",
		ErrorCode: "boom",
		ErrorText: "it broke",
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	neg := sample()
	neg.Timeout = -time.Second
	tests := map[string]broker.Envelope{
		"zero":         {},
		"full":         sample(),
		"negative":     neg,
		"idempotent":   {ID: "x", Receiver: "r", Route: broker.RouteInbox, IdempotencyKey: "order-42"},
		"streamed":     {ID: "x", Receiver: "r", Route: broker.RouteInbox, Stream: true},
		"deduplicated": {ID: "x", Receiver: "r", DedupKey: "nightly-report"},
		"both keys":    {ID: "x", Receiver: "r", IdempotencyKey: "order-42", DedupKey: "nightly-report"},
		"bigger":       {ID: "x", Content: bytes.Repeat([]byte{0xff}, 70000), Headers: map[string]string{strings.Repeat("k", 300): strings.Repeat("v", 200)}},
	}
	for name, env := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data := Encode(&env)
			got, err := Decode(data)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, env) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, env)
			}
			if again := Encode(&got); !bytes.Equal(again, data) {
				t.Fatalf("encoding is not stable: %x vs %x", again, data)
			}
		})
	}
}

func TestEncodeSortsHeaders(t *testing.T) {
	t.Parallel()
	a := broker.Envelope{Headers: map[string]string{"z": "1", "a": "2", "m": "3"}}
	first := Encode(&a)
	for range 20 {
		if got := Encode(&a); !bytes.Equal(got, first) {
			t.Fatalf("Encode is not deterministic: %x vs %x", got, first)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	valid := sample()
	good := Encode(&valid)
	unsorted := []byte{Version, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 'b', 0, 1, 'a', 0}
	dup := []byte{Version, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 'a', 0, 1, 'a', 0}
	tests := map[string][]byte{
		"empty":             nil,
		"bad version":       append([]byte{2}, good[1:]...),
		"truncated":         good[:len(good)-1],
		"trailing":          append(append([]byte{}, good...), 0),
		"length too big":    {Version, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"varint overflow":   {Version, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"non-minimal":       {Version, 0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"unknown flag":      {Version, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0},
		"no flags":          {Version, 0, 0, 0, 0, 0, 0, 0},
		"headers count big": {Version, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x80, 0x04},
		"headers unsorted":  unsorted,
		"headers duplicate": dup,
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env, err := Decode(data)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode(%x) = %#v, %v; want ErrMalformed", data, env, err)
			}
			if !reflect.DeepEqual(env, broker.Envelope{}) {
				t.Fatalf("Decode returned a partial envelope %#v with its error", env)
			}
		})
	}
}

func TestDecodeMinimal(t *testing.T) {
	t.Parallel()
	env, err := Decode([]byte{Version, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(env, broker.Envelope{Route: broker.RouteSender}) {
		t.Fatalf("got %#v, want the zero envelope with RouteSender (no route bit set)", env)
	}
}

// TestRoutes shows each route's flag bits, which are those of older
// versions (bit 0 FireAndForget, bit 1 FromInbox), and that both bits
// together do not decode.
func TestRoutes(t *testing.T) {
	t.Parallel()
	for route, flags := range map[broker.Route]byte{broker.RouteNone: 1, broker.RouteInbox: 2, broker.RouteSender: 0} {
		got := Encode(&broker.Envelope{Route: route})
		if want := []byte{Version, 0, 0, 0, 0, 0, 0, 0, flags, 0, 0}; !bytes.Equal(got, want) {
			t.Errorf("route %v encodes as %x, want %x", route, got, want)
		}
		env, err := Decode(got)
		if err != nil || env.Route != route {
			t.Errorf("route %v decodes as %v, %v", route, env.Route, err)
		}
	}
	if _, err := Decode([]byte{Version, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("two routes: got %v, want ErrMalformed", err)
	}
}

// TestIdempotencyKeyOptional shows that an envelope without an idempotency
// key encodes as before the field existed (flag bit 2 clear, nothing after
// the headers), and that the flag with an empty key does not decode.
func TestIdempotencyKeyOptional(t *testing.T) {
	t.Parallel()
	if got := Encode(&broker.Envelope{Route: broker.RouteSender}); !bytes.Equal(got, []byte{Version, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("an envelope without a key encodes as %x", got)
	}
	if _, err := Decode([]byte{Version, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("flag with an empty key: got %v, want ErrMalformed", err)
	}
	env, err := Decode([]byte{Version, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 1, 'k'})
	if err != nil || env.IdempotencyKey != "k" {
		t.Fatalf("got %+v, %v", env, err)
	}
}

func FuzzDecode(f *testing.F) {
	full := sample()
	f.Add(Encode(&full))
	f.Add(Encode(&broker.Envelope{}))
	f.Add([]byte{Version})
	f.Add(Encode(&broker.Envelope{ID: "x", IdempotencyKey: "k"}))
	f.Add([]byte{Version, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0}) // the flag with an empty key
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data)
		fromString, serr := DecodeString(string(data))
		if (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) || !reflect.DeepEqual(env, fromString) {
			t.Fatalf("DecodeString differs from Decode:\n got %#v, %v\nwant %#v, %v", fromString, serr, env, err)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		enc := Encode(&env)
		if !bytes.Equal(enc, data) {
			t.Fatalf("Encode(Decode(x)) != x:\n  x = %x\ngot %x", data, enc)
		}
		again, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode of Encode failed: %v", err)
		}
		if !reflect.DeepEqual(again, env) {
			t.Fatalf("round trip changed the envelope:\n got %#v\nwant %#v", again, env)
		}
	})
}

// DecodeString shares the string's memory: a message with headers decodes
// with an allocation for its Content and one for its Headers map.
func TestDecodeStringAllocs(t *testing.T) {
	env := sample()
	s := string(Encode(&env))
	var got broker.Envelope
	allocs := testing.AllocsPerRun(100, func() { got, _ = DecodeString(s) })
	if !reflect.DeepEqual(got, env) {
		t.Fatalf("DecodeString = %#v, want %#v", got, env)
	}
	if want := 2.0 + float64(mapAllocs(len(env.Headers))); allocs > want {
		t.Fatalf("DecodeString allocates %v times, want at most %v", allocs, want)
	}
}

var mapSink map[string]string

// mapAllocs is how many allocations a map of n strings takes on the heap.
func mapAllocs(n int) int {
	return int(testing.AllocsPerRun(100, func() { mapSink = make(map[string]string, n) }))
}

// AppendEncode into a buffer with room writes what Encode returns, and
// allocates nothing for an envelope without headers.
func TestAppendEncodeReusesTheBuffer(t *testing.T) {
	env := sample()
	env.Headers = nil
	want := Encode(&env)
	buf := AppendEncode(nil, &env)
	allocs := testing.AllocsPerRun(100, func() { buf = AppendEncode(buf[:0], &env) })
	if !bytes.Equal(buf, want) {
		t.Fatalf("AppendEncode = %x, want %x", buf, want)
	}
	if allocs != 0 {
		t.Fatalf("AppendEncode into a buffer with room allocates %v times, want 0", allocs)
	}
	if got := AppendEncode([]byte("x"), &env); !bytes.Equal(got[1:], want) || got[0] != 'x' {
		t.Fatalf("AppendEncode after a prefix = %x", got)
	}
}
