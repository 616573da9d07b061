package plugin

import (
	"fmt"
	"strings"
)

// kind is a resource as a user may name it on the command line: singular,
// plural or short name, each also qualified with the API group.
type kind struct {
	singular, plural, short string
}

var (
	machineKind    = kind{singular: "machine", plural: "machines", short: "ma"}
	deploymentKind = kind{singular: "machinedeployment", plural: "machinedeployments", short: "md"}
)

func (k kind) matches(typ string) bool {
	typ = strings.TrimSuffix(strings.ToLower(typ), "."+group)
	return typ == k.singular || typ == k.plural || typ == k.short
}

// qualified is how kubectl prints an object of this kind: kind.group/name.
func (k kind) qualified(name string) string {
	return k.singular + "." + group + "/" + name
}

// name picks the object name out of the arguments, which kubectl-style
// may be NAME, TYPE/NAME or TYPE NAME.
func (k kind) name(args []string) (string, error) {
	var typ, name string
	switch len(args) {
	case 1:
		var found bool
		if typ, name, found = strings.Cut(args[0], "/"); !found {
			typ, name = k.singular, args[0]
		}
	case 2:
		typ, name = args[0], args[1]
	default:
		return "", fmt.Errorf("expected NAME, TYPE/NAME or TYPE NAME of a %s, got %d arguments", k.singular, len(args))
	}
	if !k.matches(typ) {
		return "", fmt.Errorf("%q is not a %s: this command works on %s (%s)", typ, k.singular, k.plural, k.short)
	}
	if name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("%q is not a valid %s name", name, k.singular)
	}
	return name, nil
}
