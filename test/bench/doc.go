// Package bench measures Machinist against the real control plane. Its
// benchmarks run with `make bench`, never as part of `make test`; results
// and the command that produced them go to docs/benchmarks.md.
package bench
