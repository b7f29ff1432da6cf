package chaos

// resultNoReply plants a bug in retained results: the reply its sender
// received is never written to a message's record, neither by the step
// that accepts the reply nor by the worker's final write.
var resultNoReply = Mutant{
	Name: "result_no_reply",
	Bug:  "a retained result never keeps the reply its sender received",
	Edits: []Edit{{File: "internal/redisbroker/replies.go",
		Old: "ARGV[a + 4], {'rep', ARGV[a + 1]}, {})",
		New: "ARGV[a + 4], {}, {})",
	}, {File: "internal/redisbroker/results.go",
		Old: "\t\trep = rueidis.BinaryString(wire.Encode(p.Reply))\n",
		New: "",
	}},
	Needs:  "KindResult",
	Caught: func(r *Report) bool { return r.Features != nil && r.Features.Broken[brokeResult] > 0 },
	Expect: "retained results that are not what their senders saw (broken, " + brokeResult + ")",
}
