// Package persistence is csiactor's bbolt store: plugin allocations (with
// their creation sequence), volumes with their claims, past claims and
// staging usage, and the schema version.
//
// It is the only package that imports bbolt. Actor packages define the small
// interfaces they need from the store; [*Store] implements them.
package persistence
