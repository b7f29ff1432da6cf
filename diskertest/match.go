package diskertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker"
)

// Match is a condition on a message, for the Require methods: Content,
// Header and the other functions of the package make them, and a message
// matches when it meets all of those given. A condition that does not
// apply to what it is asked of (Timeout of a reply) is not met.
type Match struct {
	field string // what is compared: "Content", `Header "lang"`
	want  string // the value wanted, as printed
	text  bool   // want and the value got are texts, shown as a line diff when long
	brief string // want as the list of conditions shows it, if not want itself
	got   func(s *subject) (value string, ok bool)
}

// subject is what a Match is asked of: a message, and what the kit knows
// of it besides, by its kind.
type subject struct {
	msg  *disker.Message
	sent *Sent              // a message sent
	dv   *Delivery          // a delivery
	dl   *disker.DeadLetter // a dead letter
}

// notA is a Match's value for a subject it does not apply to.
func notA(kind string) string { return "(not " + kind + ")" }

// Content matches a message whose content is s, byte for byte.
func Content(s string) Match {
	return Match{field: "Content", want: s, text: true, got: func(sub *subject) (string, bool) {
		return string(sub.msg.Content), string(sub.msg.Content) == s
	}}
}

// ContentJSON matches a message whose content is JSON equal to s: the
// same values, whatever the spacing and the order of object keys. A
// failure shows both, indented, as a line diff. An s that is not JSON is
// never met.
func ContentJSON(s string) Match {
	want, err := canonicalJSON([]byte(s))
	if err != nil {
		want = "(invalid JSON in ContentJSON: " + err.Error() + ")"
	}
	return Match{field: "Content (JSON)", want: want, text: true, brief: s, got: func(sub *subject) (string, bool) {
		got, gerr := canonicalJSON(sub.msg.Content)
		if gerr != nil {
			return string(sub.msg.Content) + "\n(not JSON: " + gerr.Error() + ")", false
		}
		return got, err == nil && got == want
	}}
}

// canonicalJSON returns b's JSON value indented, with sorted object keys.
func canonicalJSON(b []byte) (string, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	if dec.More() {
		return "", fmt.Errorf("more than one JSON value")
	}
	out, err := json.MarshalIndent(v, "", "  ")
	return string(out), err
}

// Header matches a message whose header key is value.
func Header(key, value string) Match {
	return Match{field: "Header " + strconv.Quote(key), want: strconv.Quote(value), got: func(sub *subject) (string, bool) {
		v, ok := sub.msg.Headers[key]
		if !ok {
			return "(none)", false
		}
		return strconv.Quote(v), v == value
	}}
}

// Sender matches a message whose Sender is name ("" for a
// fire-and-forget message); for a reply, the receiver that replied.
func Sender(name string) Match {
	return eq("Sender", name, func(m *disker.Message) string { return m.Sender })
}

// ID matches the message of id.
func ID(id string) Match {
	return eq("ID", id, func(m *disker.Message) string { return m.ID })
}

// InReplyTo matches a reply to the message of id.
func InReplyTo(id string) Match {
	return eq("InReplyTo", id, func(m *disker.Message) string { return m.InReplyTo })
}

// eq is a Match of a string field of the message.
func eq(field, want string, of func(m *disker.Message) string) Match {
	return Match{field: field, want: strconv.Quote(want), got: func(sub *subject) (string, bool) {
		v := of(sub.msg)
		return strconv.Quote(v), v == want
	}}
}

// ErrorCode matches a reply that carries an error of code (such as
// disker.CodeDeadLetter); "" matches one without an error.
func ErrorCode(code string) Match {
	return Match{field: "Error.Code", want: strconv.Quote(code), got: func(sub *subject) (string, bool) {
		if sub.msg.Error == nil {
			return "(no error)", code == ""
		}
		return strconv.Quote(sub.msg.Error.Code) + " (" + sub.msg.Error.Text + ")", sub.msg.Error.Code == code
	}}
}

// Priority matches a message of priority p (WithPriority).
func Priority(p disker.Priority) Match {
	return Match{field: "Priority", want: p.String(), got: func(sub *subject) (string, bool) {
		return sub.msg.Priority.String(), sub.msg.Priority == p
	}}
}

// Group matches a message of group key (sent WithGroup).
func Group(key string) Match {
	return Match{field: "Group", want: strconv.Quote(key), got: func(sub *subject) (string, bool) {
		return strconv.Quote(sub.msg.Group), sub.msg.Group == key
	}}
}

// Attempt matches a delivery of attempt n (1 for the first), or a dead
// letter after n attempts.
func Attempt(n int) Match {
	return Match{field: "Attempt", want: strconv.Itoa(n), got: func(sub *subject) (string, bool) {
		switch {
		case sub.dv != nil:
			return strconv.Itoa(sub.dv.Message.Attempt), sub.dv.Message.Attempt == n
		case sub.dl != nil:
			return strconv.Itoa(sub.dl.Attempts), sub.dl.Attempts == n
		}
		return notA("a delivery or a dead letter"), false
	}}
}

// Ended matches a delivery that ended with o.
func Ended(o Outcome) Match {
	return Match{field: "Outcome", want: o.String(), got: func(sub *subject) (string, bool) {
		if sub.dv == nil {
			return notA("a delivery"), false
		}
		got := sub.dv.Outcome.String()
		if sub.dv.Err != nil {
			got += " (" + sub.dv.Err.Error() + ")"
		}
		return got, sub.dv.Outcome == o
	}}
}

// Reason matches a dead letter whose reason contains s.
func Reason(s string) Match {
	return Match{field: "Reason", want: "containing " + strconv.Quote(s), got: func(sub *subject) (string, bool) {
		if sub.dl == nil {
			return notA("a dead letter"), false
		}
		return strconv.Quote(sub.dl.Reason), strings.Contains(sub.dl.Reason, s)
	}}
}

// Timeout matches a message sent with timeout d (WithTimeout; 0 for
// none).
func Timeout(d time.Duration) Match {
	return sentField("Timeout", d.String(), func(s *Sent) (string, bool) { return s.Timeout.String(), s.Timeout == d })
}

// DueIn matches a message sent for d later (WithDelay, WithDeliverAt): due
// d after the broker accepted it; 0 for one sent for now.
func DueIn(d time.Duration) Match {
	return sentField("Due", "in "+d.String(), func(s *Sent) (string, bool) {
		in := s.Due.Sub(s.At)
		return "in " + in.String(), in == d
	})
}

// DueAt matches a message due at t, on the kit's clock.
func DueAt(t time.Time) Match {
	return sentField("Due", stamp(t), func(s *Sent) (string, bool) { return stamp(s.Due), s.Due.Equal(t) })
}

// ExpiresAt matches a message that expires at t, on the kit's clock
// (WithExpiry, WithExpireAt); the zero time for one that never expires.
func ExpiresAt(t time.Time) Match {
	return sentField("Expiry", stamp(t), func(s *Sent) (string, bool) { return stamp(s.Expiry), s.Expiry.Equal(t) })
}

// DedupKey matches a message sent with dedup key key (WithDedupKey).
func DedupKey(key string) Match {
	return sentField("DedupKey", strconv.Quote(key), func(s *Sent) (string, bool) {
		return strconv.Quote(s.DedupKey), s.DedupKey == key
	})
}

// FromSchedule matches a message sent by a tick of the schedule name.
func FromSchedule(name string) Match {
	return sentField("Schedule", strconv.Quote(name), func(s *Sent) (string, bool) {
		return strconv.Quote(s.Schedule), s.Schedule == name
	})
}

// sentField is a Match of what only a message sent has.
func sentField(field, want string, of func(s *Sent) (string, bool)) Match {
	return Match{field: field, want: want, got: func(sub *subject) (string, bool) {
		if sub.sent == nil {
			return notA("a message sent"), false
		}
		return of(sub.sent)
	}}
}

// stamp prints t, on the kit's clock.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "(none)"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000000000")
}

// Where matches a message for which f returns true; what describes the
// condition in a failure ("a refund over 100").
func Where(what string, f func(m disker.Message) bool) Match {
	return Match{field: "Where", want: what, got: func(sub *subject) (string, bool) {
		if f(*sub.msg) {
			return what, true
		}
		return "not " + what, false
	}}
}
