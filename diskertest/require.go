package diskertest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/diskerhq/disker"
)

// maxShown is how many messages a failure shows.
const maxShown = 10

// RequireSent fails the test unless a message was sent to receiver that
// matches every m (any message, with none), and returns the first that
// does. The failure lists the messages sent to receiver, each with how it
// differs from what was wanted (or the receivers that were sent to, when
// none was sent to receiver).
func (k *Kit) RequireSent(receiver string, m ...Match) Sent {
	k.t.Helper()
	q := strconv.Quote(receiver)
	return require(k, "RequireSent", "no message sent to "+q, "message sent to "+q, "none was sent to it"+k.sentElsewhere(),
		k.Sent(receiver), func(s *Sent) subject { return subject{msg: &s.Message, sent: s} }, m)
}

// sentElsewhere names the receivers that were sent to, for a failure.
func (k *Kit) sentElsewhere() string {
	counts := map[string]int{}
	var names []string
	for _, s := range k.Sent("") {
		if counts[s.Message.Receiver] == 0 {
			names = append(names, s.Message.Receiver)
		}
		counts[s.Message.Receiver]++
	}
	if len(names) == 0 {
		return " (no message was sent at all)"
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%q (%d)", n, counts[n])
	}
	return " (messages were sent to " + strings.Join(parts, ", ") + ")"
}

// RequireNotSent fails the test when a message sent to receiver matches
// every m (when any was, with none), and shows it.
func (k *Kit) RequireNotSent(receiver string, m ...Match) {
	k.t.Helper()
	sent := k.Sent(receiver)
	for i := range sent {
		sub := subject{msg: &sent[i].Message, sent: &sent[i]}
		if matches(&sub, m) {
			k.t.Fatalf("diskertest: RequireNotSent: a message sent to %q matches%s\n  %s", receiver, conditions(m), summary(&sub))
		}
	}
}

// RequireDelivered fails the test unless Drain ran a delivery to receiver
// that matches every m (Ended matches its outcome, Attempt its attempt),
// and returns the first that does.
func (k *Kit) RequireDelivered(receiver string, m ...Match) Delivery {
	k.t.Helper()
	q := strconv.Quote(receiver)
	return require(k, "RequireDelivered", "no delivery to "+q, "delivery to "+q,
		"Drain ran none (is the receiver served with Handle, and was Drain called after the send?)",
		k.Delivered(receiver), func(v *Delivery) subject { return subject{msg: &v.Message, dv: v} }, m)
}

// RequireReply fails the test unless a reply accepted for sender (see
// Replies) matches every m, and returns the first that does.
func (k *Kit) RequireReply(sender string, m ...Match) disker.Message {
	k.t.Helper()
	q := strconv.Quote(sender)
	return require(k, "RequireReply", "no reply to "+q, "reply to "+q,
		"none was accepted for it (did Drain run the receiver's handler?)",
		k.Replies(sender), func(r *disker.Message) subject { return subject{msg: r} }, m)
}

// RequireDeadLetter fails the test unless a dead letter of receiver
// matches every m (Reason matches its reason, Attempt its attempts), and
// returns the first that does.
func (k *Kit) RequireDeadLetter(receiver string, m ...Match) disker.DeadLetter {
	k.t.Helper()
	q := strconv.Quote(receiver)
	return require(k, "RequireDeadLetter", "no dead letter of "+q, "dead letter of "+q, "it has none",
		k.DeadLetters(receiver), func(dl *disker.DeadLetter) subject { return subject{msg: &dl.Message, dl: dl} }, m)
}

// require returns the first of items that matches every m, or fails the
// test for call, which found what ("no message sent to \"mail\""): with
// no items, saying none; else showing how each item, of a kind such as
// "message sent to \"mail\"", differs (see mismatch).
func require[T any](k *Kit, call, what, kind, none string, items []T, of func(*T) subject, m []Match) T {
	k.t.Helper()
	subs := make([]subject, len(items))
	for i := range items {
		subs[i] = of(&items[i])
	}
	if i := first(subs, m); i >= 0 {
		return items[i]
	}
	if len(items) == 0 {
		k.t.Fatalf("diskertest: %s: %s matches: %s", call, what, none)
	}
	k.t.Fatalf("%s", mismatch(call, what, kind, subs, m))
	var zero T
	return zero
}

// first returns the index of the first of subs that matches every m, or
// -1.
func first(subs []subject, m []Match) int {
	for i := range subs {
		if matches(&subs[i], m) {
			return i
		}
	}
	return -1
}

func matches(sub *subject, m []Match) bool {
	for i := range m {
		if _, ok := m[i].got(sub); !ok {
			return false
		}
	}
	return true
}

// conditions lists m as a failure states them: ":" and one per line, or
// nothing with none.
func conditions(m []Match) string {
	if len(m) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(":")
	for i := range m {
		want := m[i].want
		switch {
		case m[i].brief != "":
			want = m[i].brief
		case m[i].text:
			want = shown(want)
		}
		fmt.Fprintf(&b, "\n    %s: %s", m[i].field, want)
	}
	return b.String()
}

// mismatch is the failure of call, which found what (such as "no message
// sent to \"mail\""): the conditions, then each of subs (of a kind such
// as "message sent to \"mail\"", whose first word takes an s in the
// plural) with the conditions it does not meet.
func mismatch(call, what, kind string, subs []subject, m []Match) string {
	var b strings.Builder
	fmt.Fprintf(&b, "diskertest: %s: %s matches%s\n", call, what, conditions(m))
	if len(subs) != 1 {
		noun, rest, _ := strings.Cut(kind, " ")
		kind = noun + "s " + rest
	}
	fmt.Fprintf(&b, "%d %s (-want +got):", len(subs), kind)
	for i := range subs {
		if i == maxShown {
			fmt.Fprintf(&b, "\n  ... and %d more", len(subs)-maxShown)
			break
		}
		fmt.Fprintf(&b, "\n  #%d %s", i+1, summary(&subs[i]))
		for j := range m {
			if got, ok := m[j].got(&subs[i]); !ok {
				b.WriteString(differ(&m[j], got))
			}
		}
	}
	return b.String()
}

// summary is one line that names sub's message: its id, sender and
// content.
func summary(sub *subject) string {
	s := "id " + sub.msg.ID
	if sub.msg.Sender != "" {
		s += ", from " + strconv.Quote(sub.msg.Sender)
	}
	return s + ", content " + shown(string(sub.msg.Content))
}

// differ shows how got differs from what m wants, on lines of their own.
func differ(m *Match, got string) string {
	if !m.text {
		return fmt.Sprintf("\n      %s: -%s +%s", m.field, m.want, got)
	}
	if !strings.Contains(m.want, "\n") && !strings.Contains(got, "\n") {
		return fmt.Sprintf("\n      %s: -%s +%s", m.field, shown(m.want), shown(got)) + firstDiff(m.want, got)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n      %s:", m.field)
	for _, line := range lineDiff(m.want, got) {
		b.WriteString("\n        " + line)
	}
	return b.String()
}

// firstDiff says where two long one-line texts first differ, when a
// shortened form would hide it.
func firstDiff(want, got string) string {
	if len(want) <= maxShort && len(got) <= maxShort {
		return ""
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	from := max(i-20, 0)
	return fmt.Sprintf("\n        first difference at byte %d: -%s +%s", i, shown(want[from:]), shown(got[from:]))
}

// maxShort is the most bytes of a text a failure shows on one line.
const maxShort = 120

// shown is s quoted, shortened to maxShort bytes with a note of how much
// it left out.
func shown(s string) string {
	if len(s) <= maxShort {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:maxShort]) + fmt.Sprintf("... (%d more bytes)", len(s)-maxShort)
}
