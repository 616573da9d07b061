package strictjson_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/machinist-dev/machinist/internal/strictjson"
)

type options struct {
	Mode string `json:"mode"`
}

func TestUnmarshal(t *testing.T) {
	cases := []struct {
		in       string
		want     string
		trailing bool
		fails    bool
	}{
		{in: `{"mode":"hard"}`, want: "hard"},
		{in: " {\"mode\":\"soft\"}\n", want: "soft"},
		{in: `{"mode":"hard"}]`, trailing: true},
		{in: `{"mode":"hard"}}`, trailing: true},
		{in: `{"mode":"hard"}{"mode":"soft"}`, trailing: true},
		{in: `{"mode":"hard"} x`, trailing: true},
		{in: `{"mode":"hard","drain":false}`, fails: true},
		{in: `{"mode":1}`, fails: true},
		{in: `{"mode":`, fails: true},
	}
	for _, c := range cases {
		var o options
		err := strictjson.Unmarshal([]byte(c.in), &o)
		switch {
		case c.trailing:
			if !errors.Is(err, strictjson.ErrTrailingData) {
				t.Errorf("%s: error %v, want ErrTrailingData", c.in, err)
			}
		case c.fails:
			if err == nil || errors.Is(err, strictjson.ErrTrailingData) {
				t.Errorf("%s: error %v, want a decoding error", c.in, err)
			}
		case err != nil || o.Mode != c.want:
			t.Errorf("%s: %+v, %v; want mode %q", c.in, o, err, c.want)
		}
	}
	// A type error stays encoding/json's, for callers that say where.
	var o options
	var typeErr *json.UnmarshalTypeError
	if err := strictjson.Unmarshal([]byte(`{"mode":1}`), &o); !errors.As(err, &typeErr) {
		t.Errorf("error %v is not a *json.UnmarshalTypeError", err)
	}
}
