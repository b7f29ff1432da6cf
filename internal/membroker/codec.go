package membroker

import (
	"bytes"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// encode returns env in the form the broker stores: the Redis broker's wire
// encoding, which also keeps the broker's copy apart from the caller's.
func encode(env *broker.Envelope) []byte { return wire.Encode(env) }

// decode parses a stored entry into an envelope that shares no memory with
// it.
func decode(raw []byte) (broker.Envelope, error) {
	env, err := wire.Decode(raw)
	if err != nil {
		return broker.Envelope{}, err
	}
	env.Content = bytes.Clone(env.Content)
	return env, nil
}
