package chaos

// earlyCompletion plants a bug in batches: the script that counts a
// child's outcome (or seals the batch) queues the completion as soon as
// the sealed batch has one settled child, not when every child settled.
var earlyCompletion = Mutant{
	Name: "early_completion",
	Bug:  "a sealed batch's completion is queued at its first child's settlement, not its last",
	Edits: []Edit{{File: "internal/redisbroker/batches.go",
		Old: "if m[1] ~= 's' or tonumber(m[2]) ~= tonumber(m[3]) then return 0 end",
		New: "if m[1] ~= 's' or tonumber(m[3]) < math.min(1, tonumber(m[2])) then return 0 end",
	}},
	Needs: "NewBatch(",
	Caught: func(r *Report) bool {
		return r.Features != nil && (r.Features.Broken[brokeBatchEarly] > 0 || r.Features.Broken[brokeBatchCounts] > 0)
	},
	Expect: "completions started before their batch's last child ended (broken, " + brokeBatchEarly + "), or counts read short (" + brokeBatchCounts + ")",
}
