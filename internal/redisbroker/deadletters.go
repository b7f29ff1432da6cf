package redisbroker

import (
	"context"
	"strconv"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
	"github.com/redis/rueidis"
)

// DeadLetters lists up to max dead letters of receiver, oldest first.
func (b *Broker) DeadLetters(ctx context.Context, receiver string, max int) ([]broker.DeadLetter, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, err
	}
	if err := broker.CheckPositive("max", max); err != nil {
		return nil, err
	}
	return b.deadLettersFrom(ctx, receiver, "-", max)
}

// deadLettersFrom lists up to max dead letters of receiver from the entry
// id start (XRANGE's form: "-", "(id"), oldest first.
func (b *Broker) deadLettersFrom(ctx context.Context, receiver, start string, max int) ([]broker.DeadLetter, error) {
	entries, err := b.client.Do(ctx, b.client.B().Xrange().Key(b.keys.deadLetters(receiver)).Start(start).End("+").
		Count(int64(max)).Build()).AsXRange()
	if err != nil {
		return nil, b.fail(ctx, "dead letters", err)
	}
	out := make([]broker.DeadLetter, 0, len(entries))
	for _, e := range entries {
		f := e.FieldValues
		dl := broker.DeadLetter{Ref: e.ID, Reason: f["reason"]}
		dl.Attempts, _ = strconv.Atoi(f["attempts"])
		dl.At, _ = unixMS(f["at"])
		env, err := wire.DecodeString(f["m"])
		if err != nil || f["bad"] == "1" {
			dl.Raw = []byte(f["m"])
		} else {
			dl.Env = env
			switch f["p"] {
			case "h":
				dl.Env.Priority = broker.PriorityHigh
			case "l":
				dl.Env.Priority = broker.PriorityLow
			}
		}
		out = append(out, dl)
	}
	return out, nil
}

// RetryDeadLetters moves the dead letters refs (all when none are given)
// back to receiver's queue as new entries. Each move is one script call;
// all of them are not one step. Undecodable entries stay.
func (b *Broker) RetryDeadLetters(ctx context.Context, receiver string, refs ...string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return 0, err
	}
	keys := []string{b.keys.queue(receiver), b.keys.deadLetters(receiver),
		b.keys.queueAt(receiver, broker.PriorityHigh), b.keys.queueAt(receiver, broker.PriorityLow),
		b.keys.holders(receiver), b.keys.groups(receiver), b.keys.groupWaits(receiver), b.keys.groupTimes(receiver)}
	moved := false
	defer func() {
		if moved { // perhaps to a priority level (see levelsChanged)
			b.levelsChanged(ctx, receiver)
		}
	}()
	move := func(ids []string) (int, error) {
		n, err := scriptRequeue.Exec(ctx, b.client, keys, ids).AsInt64()
		if err != nil {
			return 0, b.fail(ctx, "retry dead letters", err)
		}
		moved = moved || n > 0
		return int(n), nil
	}
	if len(refs) > 0 {
		total := 0
		for chunk := range chunks(validRefs(refs)) {
			n, err := move(chunk)
			total += n
			if err != nil {
				return total, err
			}
		}
		return total, nil
	}
	return b.eachDeadLetterChunk(ctx, "retry dead letters", receiver, move)
}

// eachDeadLetterChunk calls f with the ids of receiver's dead letters, in
// chunks, oldest first, and sums what f returns.
func (b *Broker) eachDeadLetterChunk(ctx context.Context, op, receiver string, f func([]string) (int, error)) (int, error) {
	total := 0
	start := "-"
	for {
		entries, err := b.client.Do(ctx, b.client.B().Xrange().Key(b.keys.deadLetters(receiver)).Start(start).End("+").
			Count(maxBatch).Build()).AsXRange()
		if err != nil {
			return total, b.fail(ctx, op, err)
		}
		if len(entries) == 0 {
			return total, nil
		}
		ids := make([]string, len(entries))
		for i, e := range entries {
			ids[i] = e.ID
		}
		n, err := f(ids)
		total += n
		if err != nil || len(entries) < maxBatch {
			return total, err
		}
		start = "(" + ids[len(ids)-1]
	}
}

// PurgeDeadLetters deletes the dead letters refs (all when none are given)
// and returns how many it deleted.
func (b *Broker) PurgeDeadLetters(ctx context.Context, receiver string, refs ...string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return 0, err
	}
	dlq := b.keys.deadLetters(receiver)
	if len(refs) == 0 {
		n, err := scriptPurgeAll.Exec(ctx, b.client, []string{dlq}, nil).AsInt64()
		if err != nil {
			return 0, b.fail(ctx, "purge dead letters", err)
		}
		return int(n), nil
	}
	total := 0
	for chunk := range chunks(validRefs(refs)) {
		n, err := b.client.Do(ctx, b.client.B().Xdel().Key(dlq).Id(chunk...).Build()).AsInt64()
		if err != nil {
			return total, b.fail(ctx, "purge dead letters", err)
		}
		total += int(n)
	}
	return total, nil
}

// DeadLettersAfter lists up to p.Max dead letters of p.Receiver after the
// entry p.After (an exclusive XRANGE), oldest first.
func (b *Broker) DeadLettersAfter(ctx context.Context, p *broker.DeadLettersParams) ([]broker.DeadLetter, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	start := "-"
	if p.After != "" {
		if !validRef(p.After) {
			return nil, broker.ErrBadRef
		}
		start = "(" + p.After
	}
	return b.deadLettersFrom(ctx, p.Receiver, start, p.Max)
}

// scriptRequeue moves dead letters back to the queue.
var scriptRequeue = rueidis.NewLuaScript(`-- requeue
-- KEYS[1] -> the queue stream P:{R}:q
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the high level stream P:{R}:qh
-- KEYS[4] -> the low level stream P:{R}:ql
-- KEYS[5..8] -> the holders hash P:{R}:hold and the groups hash and zsets
--            P:{R}:g, gw and gt (groups.go)
-- ARGV    -> dead-letter ids
-- Each decodable dead letter becomes a new queue entry (m, and d and x if
-- it had them; deliveries start again from 1) at its level (field p) and
-- leaves the dead-letter stream; one of a keyed message (fields g and i)
-- goes behind its key, at its tail (gpush).
-- Undecodable ones (bad=1) and unknown ids are left alone.
-- Returns how many moved.
` + luaNow + luaDeferred + luaQueueMessage + luaGroups + `
local G = {q = KEYS[1], h = KEYS[3], l = KEYS[4], hold = KEYS[5], g = KEYS[6], w = KEYS[7], t = KEYS[8], first = 0}
local n = 0
for _, id in ipairs(ARGV) do
  local e = redis.call('XRANGE', KEYS[2], id, id)
  if e[1] then
    local f = e[1][2]
    local m, d, x, bad, q, level, key, mid = nil, '', '', nil, KEYS[1], '', nil, nil
    for j = 1, #f, 2 do
      if f[j] == 'm' then m = f[j + 1]
      elseif f[j] == 'g' then key = f[j + 1]
      elseif f[j] == 'i' then mid = f[j + 1]
      elseif f[j] == 'd' then d = f[j + 1]
      elseif f[j] == 'x' then x = f[j + 1]
      elseif f[j] == 'bad' then bad = f[j + 1]
      elseif f[j] == 'p' and f[j + 1] == 'h' then q, level = KEYS[3], 'h'
      elseif f[j] == 'p' and f[j + 1] == 'l' then q, level = KEYS[4], 'l' end
    end
    if m and bad ~= '1' and key and mid then
      local times = d
      if x ~= '' then times = times .. ',' .. x end
      gpush(G, key, mid, level .. times .. ':' .. m)
      redis.call('XDEL', KEYS[2], id)
      n = n + 1
    elseif m and bad ~= '1' then
      if level ~= '' and redis.call('XLEN', q) == 0 then
        queueWake(KEYS[1], KEYS[5])
      end
      queueMessage(q, m, d, x)
      redis.call('XDEL', KEYS[2], id)
      n = n + 1
    end
  end
end
return n
`)

// scriptPurgeAll deletes a dead-letter stream.
var scriptPurgeAll = rueidis.NewLuaScript(`-- purge_all
-- KEYS[1] -> the dead-letter stream P:{R}:dlq
-- Returns how many entries it held.
local n = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
`)
