// Package api is csiactor's HTTP API: the handlers that serve a [Backend]
// (the runtime) and the typed [Client] that the CLI and embedders use to
// talk to an agent.
//
// # Basics
//
// The agent serves [NewHandler] on its unix socket, made by [ListenUnix]
// with mode 0600: the full API. On its TCP address it serves
// [NewTCPHandler]: /metrics and GET /v1/health, and the full API only to
// requests that carry a configured bearer token ([Tokens]), as far as its
// [Scope] allows (read, claim or operator; 403 beyond it).
//
// Bodies are JSON with snake_case fields (the types of package runtime).
// Errors are {"error": "..."} with 400 for bad input (the message names the
// field), 401 for a missing or wrong token, 403 for a token whose scope
// does not allow the request, 404 for an unknown object or
// route, 405 for a wrong method, 409 for a conflict (claim limit, volume in
// use), 413 for a body over the limit, 503 when the plugin is unavailable
// or the agent is shutting down, and 500 otherwise. GET /v1/events writes
// newline-delimited JSON; with ?follow=true it keeps streaming until the
// client goes away. GET /v1/allocations/{id}/logs writes an exec-managed
// plugin's output the same way ({"time","stream","line"} per line; ?tail=N
// for the last N lines), and with ?follow=true streams until the client
// goes or the allocation is deregistered.
//
// [Client] mirrors [Backend] over HTTP, so either can be used where the
// other is expected. Its errors are [*Error] (the agent answered with an
// error status; errors.Is matches the runtime sentinels) or
// [*UnreachableError] (no agent at the address).
//
// # The spec
//
// openapi.yaml, beside this file, describes every route, parameter, body,
// field and error answer (OpenAPI 3.0). The package's tests keep it true:
// the routes registered in newServer and the spec's operations must be
// the same set, and real answers (a runtime driving the example plugin,
// and the fake backend of package apitest for the states it cannot reach)
// are validated against it, errors included, with kin-openapi. To add or
// change a route, field or status: change the handler, then openapi.yaml
// (schemas are closed with additionalProperties: false, so a new field
// fails the tests until it is described), then add a request for it to
// TestOpenAPI_Answers, which wants every operation seen answering a
// success and an error.
//
// # Caveats
//
// Request logs carry method, path, status and duration only: never a
// body, so never a secret or a mount flag.
package api
