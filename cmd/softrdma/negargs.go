package main

import (
	"regexp"
	"strings"

	"github.com/alecthomas/kong"
)

// negativeValue matches a negative number or duration: -1, -5, -0.5,
// -1s, -1.5ms.
var negativeValue = regexp.MustCompile(`^-\.?[0-9]`)

// joinNegativeValues rewrites "--flag -1" (and "-s -1") into
// "--flag=-1" ("--size=-1") when the flag takes a value and the next token is a
// negative number or duration. kong takes a token beginning with "-" for
// a flag, not a value, and its error ("expected duration value but got
// "-1s" (short flag); perhaps try --connect-timeout="-1s"?") hides what
// is wrong; joined, the value reaches the tools' own checks, which say
// "--connect-timeout -1s: must not be negative" and exit 2. No flag of
// these tools has a digit for its short name, so nothing else changes.
func joinNegativeValues(app *kong.Application, args []string) []string {
	node := app.Node
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if !strings.HasPrefix(a, "-") {
			for _, c := range node.Children {
				if c.Name == a || contains(c.Aliases, a) {
					node = c
					break
				}
			}
			out = append(out, a)
			continue
		}
		if i+1 < len(args) && !strings.Contains(a, "=") && negativeValue.MatchString(args[i+1]) {
			if f := findFlag(node, a); f != nil && !f.IsBool() && !f.IsCounter() {
				// kong takes "=" after a long name only ("-s=-1" would
				// give the value "=-1").
				out = append(out, "--"+f.Name+"="+args[i+1])
				i++
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

// findFlag returns the flag of node (or of a node above it) that the
// token names: "--name", "--alias" or "-x".
func findFlag(node *kong.Node, tok string) *kong.Flag {
	for n := node; n != nil; n = n.Parent {
		for _, f := range n.Flags {
			switch {
			case strings.HasPrefix(tok, "--"):
				if name := tok[2:]; f.Name == name || contains(f.Aliases, name) {
					return f
				}
			case len(tok) == 2 && f.Short != 0 && rune(tok[1]) == f.Short:
				return f
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
