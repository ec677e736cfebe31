// Package bench holds molt's benchmarks that compare molt with baselines
// side by side in one run (`molt bench ...`). They run against a real
// daemon (an ephemeral one unless told otherwise), through the API, as a
// user would see it.
package bench
