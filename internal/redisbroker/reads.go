package redisbroker

import (
	"errors"
	"fmt"

	"github.com/redis/rueidis"
)

// entry is a stream entry as a fetch returns it.
type entry struct {
	id      string
	attempt int
	// fields are the entry's field names and values, in turns, as the
	// client holds them (see xentry).
	fields []rueidis.RedisMessage
}

// field returns the value of the entry's field name, the last if it has
// several, and whether it has one.
func (e *entry) field(name string) (string, bool) {
	for i := len(e.fields) - 2; i >= 0; i -= 2 {
		if mustString(&e.fields[i]) == name {
			return mustString(&e.fields[i+1]), true
		}
	}
	return "", false
}

// only reports whether every field of the entry is called name (and it
// has at least one).
func (e *entry) only(name string) bool {
	for i := 0; i < len(e.fields); i += 2 {
		if mustString(&e.fields[i]) != name {
			return false
		}
	}
	return len(e.fields) > 0
}

// mustString is the string that m, a string checked by asXRead or
// scriptEntry, holds.
func mustString(m *rueidis.RedisMessage) string {
	s, _ := m.ToString()
	return s
}

// xentry is a stream entry as XREAD or XREADGROUP answers it: its id, and
// its field names and values in turns as the client holds them, so that
// reading an entry copies nothing. deleted is set for an entry deleted
// after it was added (a pending one, read again).
type xentry struct {
	ID      string
	fields  []rueidis.RedisMessage
	deleted bool
}

// asXRead is rueidis's AsXRead of res, an answer of XREAD or XREADGROUP,
// with the entries as xentry: a stream entry costs no map. An error of
// res, such as a nil answer's, is returned as it is.
func asXRead(res rueidis.RedisResult) (map[string][]xentry, error) {
	read := make(map[string][]xentry, 1)
	err := eachStream(res, func(name string, es *rueidis.RedisMessage) (err error) {
		read[name], err = asXRange(es)
		return err
	})
	if err != nil {
		return nil, err
	}
	return read, nil
}

// asXReadOf is asXRead of a read of one stream: its entries alone, with
// no map of the streams.
func asXReadOf(res rueidis.RedisResult, stream string) ([]xentry, error) {
	var read []xentry
	err := eachStream(res, func(name string, es *rueidis.RedisMessage) (err error) {
		if name == stream {
			read, err = asXRange(es)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return read, nil
}

// eachStream calls f with the name and the entries of each stream of res,
// an answer of XREAD or XREADGROUP (a map of the streams on RESP3, an
// array of pairs on RESP2), and returns the first error.
func eachStream(res rueidis.RedisResult, f func(name string, es *rueidis.RedisMessage) error) error {
	m, err := res.ToMessage()
	if err != nil {
		return err
	}
	if m.IsMap() {
		kv, err := m.ToMap()
		if err != nil {
			return err
		}
		for name, es := range kv {
			if err := f(name, &es); err != nil {
				return err
			}
		}
		return nil
	}
	streams, err := m.ToArray()
	if err != nil {
		return err
	}
	for i := range streams {
		name, es, err := namedPair(&streams[i], "a stream of a read")
		if err != nil {
			return err
		}
		if err := f(name, es); err != nil {
			return err
		}
	}
	return nil
}

// namedPair returns the elements of m, what (for errors) that must be an
// array of a string and another element.
func namedPair(m *rueidis.RedisMessage, what string) (string, *rueidis.RedisMessage, error) {
	pair, err := m.ToArray()
	if err != nil {
		return "", nil, err
	}
	if len(pair) != 2 {
		return "", nil, fmt.Errorf("redisbroker: %s has %d elements, wanted 2", what, len(pair))
	}
	name, err := pair[0].ToString()
	if err != nil {
		return "", nil, err
	}
	return name, &pair[1], nil
}

// asXRange returns the entries of one stream of a read.
func asXRange(m *rueidis.RedisMessage) ([]xentry, error) {
	es, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]xentry, 0, len(es))
	for i := range es {
		id, fv, err := namedPair(&es[i], "a stream entry")
		if err != nil {
			return nil, err
		}
		if fv.IsNil() {
			out = append(out, xentry{ID: id, deleted: true})
			continue
		}
		fields, err := fv.ToArray()
		if err != nil {
			return nil, err
		}
		if err := checkFields(fields); err != nil {
			return nil, err
		}
		out = append(out, xentry{ID: id, fields: fields})
	}
	return out, nil
}

// checkFields checks that fields are names and values in turns, all strings.
func checkFields(fields []rueidis.RedisMessage) error {
	if len(fields)%2 != 0 {
		return fmt.Errorf("redisbroker: a stream entry has %d field names and values", len(fields))
	}
	for i := range fields {
		if !fields[i].IsString() {
			return errors.New("redisbroker: a stream entry has a field that is not a string")
		}
	}
	return nil
}

// appendRead appends the entries of an XREADGROUP of one stream, whose
// refs are their ids with prefix (that of the stream's priority level).
func appendRead(entries []entry, read []xentry, prefix string) []entry {
	for _, e := range read {
		if e.deleted {
			continue // deleted after it was added
		}
		entries = append(entries, entry{id: prefix + e.ID, attempt: 1, fields: e.fields})
	}
	return entries
}

// scriptEntry parses {id, attempt, field1, value1, ...}.
func scriptEntry(m rueidis.RedisMessage) (entry, error) {
	a, err := m.ToArray()
	if err != nil || len(a) < 2 || len(a)%2 != 0 {
		return entry{}, fmt.Errorf("fetch script answered a malformed entry: %v", err)
	}
	id, err := a[0].ToString()
	if err != nil {
		return entry{}, err
	}
	attempt, err := a[1].AsInt64()
	if err != nil {
		return entry{}, err
	}
	if checkFields(a[2:]) != nil {
		return entry{}, errors.New("fetch script answered a malformed field")
	}
	return entry{id: id, attempt: int(attempt), fields: a[2:]}, nil
}
