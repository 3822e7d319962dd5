// Package operr prefixes an error with the package and operation that
// returned it, once: the prefixes the wrapped error's text already starts
// with (its own package's, such as ErrMWBound's "placement: ", and the
// same operation's, such as placement's "dereg MR: ") are dropped, so that
// softrdma.DeregMR says "softrdma: dereg MR: memory windows are bound to
// the MR: device or resource busy" rather than "softrdma: dereg MR:
// placement: dereg MR: placement: memory windows are bound …". errors.Is
// and errors.As see the wrapped error.
package operr

import "strings"

// Prefixes dropped from a wrapped error's text: the root package's and
// those of the layers under it that its users do not see (placement,
// transport). Those of hostmem, pagetable and stag stay: they name the
// facility that refused (the pin limit, a page table).
var packages = []string{"softrdma: ", "placement: ", "transport: "}

// Error is an error with the operation that returned it.
type Error struct {
	Prefix string // e.g. "softrdma: dereg MR"
	Op     string // e.g. "dereg MR", dropped from the front of Err's text
	Err    error
}

// Wrap returns err prefixed with pkg ("softrdma") and op ("dereg MR"),
// or nil for a nil err.
func Wrap(pkg, op string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Prefix: pkg + ": " + op, Op: op, Err: err}
}

func (e *Error) Error() string {
	return e.Prefix + ": " + Trim(e.Err.Error(), e.Op)
}

func (e *Error) Unwrap() error { return e.Err }

// Trim drops from the front of msg, as often as they occur, the prefixes
// "softrdma: ", "placement: ", "transport: " and op followed by ": ".
func Trim(msg, op string) string {
	for {
		before := msg
		for _, p := range packages {
			msg = strings.TrimPrefix(msg, p)
		}
		if op != "" {
			msg = strings.TrimPrefix(msg, op+": ")
		}
		if msg == before {
			return msg
		}
	}
}
