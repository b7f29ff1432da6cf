package disker

import (
	"strconv"
)

// MaxNameLength is the longest receiver or sender name, in bytes.
const MaxNameLength = 200

// validName reports why name is not a valid receiver or sender name, or ""
// when it is. A name is 1..MaxNameLength bytes of [A-Za-z0-9._:-] and does
// not start with '_' (reserved for Disker's own names).
func validName(name string) string {
	if name == "" {
		return "must not be empty"
	}
	if len(name) > MaxNameLength {
		return "longer than 200 bytes"
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return "has a character outside [A-Za-z0-9._:-] at byte " + strconv.Itoa(i)
		}
	}
	if name[0] == '_' {
		return "must not start with '_' (reserved for Disker's own names)"
	}
	return ""
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '-'
}

// ValidateName checks a receiver or sender name by the rule every call of
// Disker applies: a name is 1..MaxNameLength bytes of letters, digits and
// '.', '_', ':', '-' (that is, [A-Za-z0-9._:-]), and does not start with
// '_', which is reserved for Disker's own names (such as the private reply
// address of Request). It returns nil for a valid name, and otherwise a
// *ValidationError with Field "name" whose Reason quotes the name and says
// what is wrong with it.
func ValidateName(name string) error { return checkName("name", name) }

// checkName is ValidateName for the named field.
func checkName(field, name string) error {
	if r := validName(name); r != "" {
		return invalid(field, "%q %s", name, r)
	}
	return nil
}
