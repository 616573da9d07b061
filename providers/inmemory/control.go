package inmemory

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// ControlHandler serves the provider's fault injection and books over
// HTTP, for tests that run it out of process (`machinist provider serve
// --provider inmemory --inmemory-control …`): what SetFaults, FailNext,
// LoseNextReplies, Crash, Break, MakeUnowned, Restarts, BootID, NodeName
// and Instances do in process. Requests and answers are JSON; an instance
// is named by the query parameter id (its providerID); an unknown one is
// 404.
func (p *Provider) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /faults", func(w http.ResponseWriter, r *http.Request) {
		var f ProviderSpec
		if !decode(w, r, &f) {
			return
		}
		p.SetFaults(f)
		w.WriteHeader(http.StatusNoContent)
	})
	count := func(set func(int)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var body struct {
				N int `json:"n"`
			}
			if !decode(w, r, &body) {
				return
			}
			set(body.N)
			w.WriteHeader(http.StatusNoContent)
		}
	}
	mux.Handle("PUT /fail-next", count(p.FailNext))
	mux.Handle("PUT /lose-next-replies", count(p.LoseNextReplies))
	act := func(do func(string) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			answer(w, struct{}{}, do(r.URL.Query().Get("id")))
		}
	}
	mux.Handle("POST /crash", act(p.Crash))
	mux.Handle("POST /break", act(p.Break))
	mux.HandleFunc("POST /unowned", func(w http.ResponseWriter, r *http.Request) {
		var body Unowned
		if !decode(w, r, &body) {
			return
		}
		id, err := p.MakeUnowned(body.Namespace, body.Name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		answer(w, Unowned{Namespace: body.Namespace, Name: body.Name, ProviderID: id}, nil)
	})
	mux.HandleFunc("GET /instance", func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("id")
		var out Books
		var err error
		if out.Restarts, err = p.Restarts(id); err == nil {
			if out.NodeName, err = p.NodeName(id); err == nil {
				out.BootID, err = p.BootID(id)
			}
		}
		answer(w, out, err)
	})
	mux.HandleFunc("GET /instances", func(w http.ResponseWriter, _ *http.Request) {
		answer(w, p.Instances(), nil)
	})
	return mux
}

// Books is what ControlHandler tells of one instance.
type Books struct {
	Restarts int    `json:"restarts"`
	NodeName string `json:"nodeName"`
	BootID   string `json:"bootID"`
}

// Unowned asks ControlHandler for an instance that belongs to no Machine
// (MakeUnowned), and is its answer, with the providerID.
type Unowned struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	ProviderID string `json:"providerID,omitempty"`
}

func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := json.NewDecoder(r.Body).Decode(into); err != nil {
		http.Error(w, fmt.Sprintf("the body is not the JSON expected: %v", err), http.StatusBadRequest)
		return false
	}
	return true
}

func answer(w http.ResponseWriter, out any, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
