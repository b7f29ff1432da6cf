package chaos

// The check of retained results (results.go): the retained fate of a
// message is the outcome its sender saw.

import "strings"

// brokeResult: a retained result that is not the outcome its sender saw
// (another state, another reply), or none at all.
const brokeResult = "result_mismatch"

// resultStates are the retained states that each outcome of a sender
// allows.
var resultStates = map[string]map[string]bool{
	ResultReply:       {"succeeded": true},
	ResultTimeout:     {"timed_out": true},
	ResultRemoteError: {"failed": true, "dead_lettered": true, "cancelled": true, "expired": true},
}

// results checks each looked-up result (KindResult) against its sender's
// one outcome: the state that outcome allows, and for a reply, the same
// content. A message whose sender saw no outcome, or two, is judged by
// the other checks; a lookup that failed (Redis unreachable at the end)
// proves nothing. Check calls it from checkFeatures.
func (c *features) results(events []Event) {
	opOfID := map[string]string{}
	for _, e := range events {
		if e.Kind == KindSent || e.Kind == KindStart {
			opOfID[e.ID] = e.Op
		}
	}
	outcomes := map[string][]Event{}
	var looked []Event
	for _, e := range events {
		switch e.Kind {
		case KindOutcome:
			op := e.Op
			if id, ok := strings.CutPrefix(op, "id:"); ok {
				op = opOfID[id]
			}
			outcomes[op] = append(outcomes[op], e)
		case KindResult:
			looked = append(looked, e)
		}
	}
	if len(looked) > 0 {
		c.f.Broken[brokeResult] += 0 // listed, at 0, once results were looked up
	}
	for _, e := range looked {
		out := outcomes[e.Op]
		switch {
		case e.Result == ResultError:
			c.f.Explained[brokeResult+" by lookup_error"]++
			continue
		case len(out) != 1:
			c.f.Exercised["results_without_one_outcome"]++
			continue
		}
		c.f.Exercised["results_checked"]++
		o := out[0]
		switch {
		case !resultStates[o.Result][e.Result]:
			c.brokeState(brokeResult, c.resultSpan(e, o), "the retained result of %s (%s) is %s, its sender saw %s", e.Op, e.ID, e.Result, o.Result)
		case o.Result == ResultReply && e.Reply != o.Reply:
			c.brokeState(brokeResult, c.resultSpan(e, o), "the retained reply of %s (%s) is %q, its sender got %q", e.Op, e.ID, e.Reply, o.Reply)
		}
	}
}

// resultSpan is the span of the retained result of the lookup e, whose
// sender saw o: the broker writes it when the message is settled (a
// handler's end, its deadline, a dead letter), after its send began and
// by the time its sender saw the outcome or its last handler ended; a
// failover after that may lose it for good, seen by the lookup.
func (c *features) resultSpan(e, o Event) lossSpan {
	s := lossSpan{written: o.T, writtenTo: o.T, seen: e.T}
	if h := c.ops[e.Op]; h != nil && h.send != nil {
		s.written = h.send.T
		for _, end := range h.ends {
			s.writtenTo = max(s.writtenTo, end.T)
		}
	}
	return s
}
