package disker

import (
	"math/rand/v2"
	"strings"
	"time"
)

// crockford is the Crockford base32 alphabet: ids sort as their creation
// time does.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// newID returns a new message id: 26 characters of Crockford base32 over 48
// bits of Unix milliseconds and 80 random bits, so ids are unique and sort
// by creation time (to the millisecond). The random bits come from the
// runtime's ChaCha8 generator, seeded by the system: no syscall per id.
func newID() string { return idAt(time.Now().UnixMilli()) }

// idAt returns a new id made at ms Unix milliseconds.
func idAt(ms int64) string {
	hi := uint64(ms)<<16 | rand.Uint64()&0xffff
	lo := rand.Uint64()
	var out [26]byte
	// 128 bits as 26 base32 digits: the first digit carries the top 3 bits.
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// idTime returns the time an id made by newID was made, to the
// millisecond: its first 10 digits are the 48 bits of Unix milliseconds.
// It reports false for a string that is not such an id.
func idTime(id string) (time.Time, bool) {
	if len(id) != 26 {
		return time.Time{}, false
	}
	var ms int64
	for i := range 26 {
		v := strings.IndexByte(crockford, id[i])
		if v < 0 || (i == 0 && v > 7) {
			return time.Time{}, false
		}
		if i < 10 {
			ms = ms<<5 | int64(v)
		}
	}
	return time.UnixMilli(ms), true
}
