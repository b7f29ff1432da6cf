// Package fixture is the API after compatible changes, for apicheck's tests:
// a field and a function added, a parameter renamed.
package fixture

// Store is an interface that callers implement.
type Store interface {
	Get(key string) (string, error)
}

// Options configures Open.
type Options struct {
	Size int
	Name string
}

// Open opens a store.
func Open(opts Options) (Store, error) { return nil, nil }

// Close closes what Open opened.
func Close() {}

// Version is the fixture's version.
func Version() string { return "2" }
