package disker

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNewID(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool, 10000)
	for range 10000 {
		id := newID()
		if len(id) != 26 || strings.Trim(id, crockford) != "" {
			t.Fatalf("id %q is not 26 Crockford base32 digits", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
	// Ids sort by creation time, to the millisecond.
	now := time.Now().UnixMilli()
	for _, ms := range []int64{0, 1, 31, 32, 1 << 20, now, 1<<48 - 2} {
		for range 100 {
			if a, b := idAt(ms), idAt(ms+1); a >= b {
				t.Fatalf("id %q made at %d does not sort before %q made at %d", a, ms, b, ms+1)
			}
		}
	}
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"a": true, "A-z_0.9:x": true, strings.Repeat("n", MaxNameLength): true,
		"": false, strings.Repeat("n", MaxNameLength+1): false, "a b": false, "a{b": false,
		"a*": false, "a/b": false, "é": false, "_inbox.x": false, "a\n": false,
	} {
		if got := validName(name) == ""; got != ok {
			t.Errorf("validName(%q) valid = %v, want %v (%s)", name, got, ok, validName(name))
		}
		err := ValidateName(name)
		var ve *ValidationError
		switch {
		case ok && err != nil:
			t.Errorf("ValidateName(%q) = %v, want nil", name, err)
		case !ok && (!errors.As(err, &ve) || ve.Field != "name" || ve.Reason != strconv.Quote(name)+" "+validName(name)):
			t.Errorf("ValidateName(%q) = %#v, want a *ValidationError of field name with the reason", name, err)
		}
	}
}
