// Package strictjson decodes one JSON object the way a field that a user
// or a tenant writes must be read: a field the type does not know is an
// error, and so is anything after the object. encoding/json's Unmarshal
// ignores unknown fields, and a Decoder stops after the first value (its
// More is false before a ']' or '}' that follows), so `{"mode":"hard"}]`
// would otherwise be read as a valid body.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrTrailingData is wrapped in Unmarshal's error when data holds
// something after its JSON value.
var ErrTrailingData = errors.New("unexpected data after the JSON object")

// Unmarshal decodes data into v, refusing unknown fields and anything but
// white space after the value. A decoding error is encoding/json's, as it
// is, so that callers may tell a syntax error from a type error.
func Unmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if rest := bytes.TrimSpace(data[dec.InputOffset():]); len(rest) > 0 {
		return fmt.Errorf("%w: %.20q", ErrTrailingData, rest)
	}
	return nil
}
