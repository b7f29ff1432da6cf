package chaos

// groupOverlap needs a fault run that sends keyed messages (WithGroup),
// and a check that a key's messages run one at a time: both come with the
// fault run's keyed groups. Until then `make chaos-mutants` reports it as
// not run.
var groupOverlap = Mutant{
	Name: "group_overlap",
	Bug:  "a key's next message is handed out while its first still runs (a group's concurrency of 1 lets 2 out)",
	Edits: []Edit{{File: "internal/redisbroker/groups.go",
		Old: "  if head >= tail and out < G.n and gtoken(G, key) then\n",
		New: "  if head >= tail and out <= G.n and gtoken(G, key) then\n",
	}},
	Needs:  "disker.WithGroup(",
	Caught: func(r *Report) bool { return !r.OK() },
	Expect: "a broken invariant (two messages of one key at once)",
}
