package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/runtime"
)

// Scope is what a bearer token may do on the TCP listener. Each scope
// includes the ones before it: ScopeRead < ScopeClaim < ScopeOperator.
type Scope string

const (
	// ScopePublic marks the routes served to anyone, without a token:
	// /metrics, GET /v1/health and GET /v1/ready. No token has it.
	ScopePublic Scope = "public"
	// ScopeRead allows every GET, including the events stream.
	ScopeRead Scope = runtime.TokenScopeRead
	// ScopeClaim allows ScopeRead, claims and releases (not forced ones).
	ScopeClaim Scope = runtime.TokenScopeClaim
	// ScopeOperator allows everything.
	ScopeOperator Scope = runtime.TokenScopeOperator
)

// rank orders the scopes; a scope allows what needs a rank at most its own.
func (s Scope) rank() int {
	switch s {
	case ScopePublic:
		return 0
	case ScopeRead:
		return 1
	case ScopeClaim:
		return 2
	case ScopeOperator:
		return 3
	}
	return -1
}

// Allows reports whether a token of scope s may make a request that needs
// scope need.
func (s Scope) Allows(need Scope) bool {
	return s.rank() >= 1 && need.rank() >= 0 && s.rank() >= need.rank()
}

// UnixTokenName is the name the requests of the unix socket are recorded
// under (in their log line and event): the socket has no token; its file
// permissions let only root or its owner in, with ScopeOperator.
const UnixTokenName = runtime.UnixTokenName

// DefaultTokenName is the name of the token of api.token_file.
const DefaultTokenName = runtime.DefaultTokenName

// Identity is who made a request: the name of its token (UnixTokenName on
// the unix socket) and its scope.
type Identity struct {
	Name  string `json:"name"`
	Scope Scope  `json:"scope"`
}

// reqInfo is what the layers of a request tell its log line: the token's
// identity once it is known, and whether an event already records the
// request.
type reqInfo struct {
	id       Identity
	recorded bool
	// about names the objects of a write that its body, not its path,
	// names (the volume a create makes, the alloc of a claim), for its
	// EventAPIWrite.
	about runtime.Event
}

type reqInfoKey struct{}

// infoOf returns r's reqInfo (a throw-away one outside logged).
func infoOf(ctx context.Context) *reqInfo {
	if ri, ok := ctx.Value(reqInfoKey{}).(*reqInfo); ok {
		return ri
	}
	return &reqInfo{}
}

// identityOf returns who made the request of ctx.
func identityOf(ctx context.Context) Identity {
	id := infoOf(ctx).id
	if id.Name == "" {
		return Identity{Name: UnixTokenName, Scope: ScopeOperator}
	}
	return id
}

// TokenSpec is one token the TCP listener accepts: the token in File,
// known as Name, with Scope. Key is the config key it comes from
// ("api.tokens[1]"), which errors and logs name.
type TokenSpec struct {
	Key   string
	Name  string
	File  string
	Scope Scope
}

// TokenSpecs returns the tokens of cfg: api.token_file as the operator
// token DefaultTokenName, then api.tokens.
func TokenSpecs(cfg runtime.APIConfig) []TokenSpec {
	var specs []TokenSpec
	if cfg.TokenFile != "" {
		specs = append(specs, TokenSpec{Key: "api.token_file", Name: DefaultTokenName, File: cfg.TokenFile, Scope: ScopeOperator})
	}
	for i, t := range cfg.Tokens {
		specs = append(specs, TokenSpec{Key: fmt.Sprintf("api.tokens[%d]", i), Name: t.Name, File: t.File, Scope: Scope(t.Scope)})
	}
	return specs
}

// racyWindow is how recent a token file's modification time may be, when
// the file is read, for its stamp not to be trusted: file systems keep
// modification times in coarse ticks (milliseconds, or whole seconds), so
// a file rewritten in place with the same length within one tick keeps its
// stamp. Such a file is read again at every request until it is older.
const racyWindow = 2 * time.Second

// Tokens is the set of bearer tokens of the TCP listener. Their files are
// looked at again (one stat each) at every request: a file whose
// modification time, size, inode or mode changed is read again, so that a
// new value works and the old one is refused from that request on; a file
// removed or made invalid revokes its token at once (with an error logged
// naming its config key, never the value) until it is valid again.
//
// A Tokens is safe for concurrent use.
type Tokens struct {
	log *logrus.Entry
	now func() time.Time

	mu      sync.Mutex
	entries []*tokenEntry // guarded by mu
}

// tokenEntry is one token. Its fields but spec are guarded by Tokens.mu.
type tokenEntry struct {
	spec   TokenSpec
	value  string // "" while revoked
	digest [sha256.Size]byte
	stat   fileStamp
	// racy says the file was modified less than racyWindow before it was
	// read, so its stamp may hide a later rewrite: it is read again at
	// every request until it is older.
	racy bool
}

// fileStamp is what says a token file changed.
type fileStamp struct {
	mtime int64 // nanoseconds since the epoch
	size  int64
	ino   uint64
	mode  os.FileMode
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{mtime: fi.ModTime().UnixNano(), size: fi.Size(), mode: fi.Mode()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

// NewTokens reads the token files of specs. A file that is missing,
// unreadable, readable by group or others or empty, an unknown scope, an
// empty or repeated name, the name UnixTokenName and a value that two
// tokens share are errors
// naming the config key, never the value. log receives the errors of
// later reads (nil discards them).
func NewTokens(specs []TokenSpec, log *logrus.Entry) (*Tokens, error) {
	if log == nil {
		log = discardLog()
	}
	t := &Tokens{log: log, now: time.Now}
	names := map[string]string{}
	for _, sp := range specs {
		if sp.Name == "" {
			return nil, fmt.Errorf("%s.name: must not be empty", sp.Key)
		}
		if sp.Name == UnixTokenName {
			return nil, fmt.Errorf("%s.name: %q is the name the unix socket's requests are recorded under; choose another", sp.Key, sp.Name)
		}
		if prev, ok := names[sp.Name]; ok {
			return nil, fmt.Errorf("%s.name: %q is also the name of %s", sp.Key, sp.Name, prev)
		}
		names[sp.Name] = sp.Key
		if sp.Scope.rank() < 1 {
			return nil, fmt.Errorf("%s.scope: %q: want read, claim or operator", sp.Key, sp.Scope)
		}
		e := &tokenEntry{spec: sp}
		if err := e.read(t.now()); err != nil {
			return nil, fmt.Errorf("%s: %w", fileKey(sp), err)
		}
		if other := t.sameValueLocked(e); other != nil {
			return nil, fmt.Errorf("%s: the same token as %s; give each token its own value", fileKey(sp), fileKey(other.spec))
		}
		t.entries = append(t.entries, e)
	}
	return t, nil
}

// staticTokens is the one operator token of NewTCPHandler's token
// argument, which no file backs.
func staticTokens(token string) *Tokens {
	t := &Tokens{log: discardLog(), now: time.Now}
	if token != "" {
		t.entries = []*tokenEntry{{spec: TokenSpec{Key: "token", Name: DefaultTokenName, Scope: ScopeOperator},
			value: token, digest: sha256.Sum256([]byte(token))}}
	}
	return t
}

// fileKey is the config key of sp's file.
func fileKey(sp TokenSpec) string {
	if strings.HasSuffix(sp.Key, "_file") {
		return sp.Key
	}
	return sp.Key + ".file"
}

// read reads e's file into e at time now.
func (e *tokenEntry) read(now time.Time) error {
	fi, err := os.Stat(e.spec.File)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	tok, err := ReadTokenFile(e.spec.File)
	if err != nil {
		return err
	}
	e.value, e.digest, e.stat = tok, sha256.Sum256([]byte(tok)), stampOf(fi)
	e.racy = now.Sub(fi.ModTime()) < racyWindow
	return nil
}

// sameValueLocked returns the entry other than e with e's value.
func (t *Tokens) sameValueLocked(e *tokenEntry) *tokenEntry {
	for _, o := range t.entries {
		if o != e && o.value != "" && subtle.ConstantTimeCompare(o.digest[:], e.digest[:]) == 1 {
			return o
		}
	}
	return nil
}

// Configured reports whether any token is configured (revoked or not).
func (t *Tokens) Configured() bool {
	return len(t.entries) > 0
}

// refreshLocked looks at every token file and reads again those that
// changed (and those whose stamp is too recent to be trusted).
func (t *Tokens) refreshLocked() {
	now := t.now()
	for _, e := range t.entries {
		if e.spec.File == "" {
			continue
		}
		log := t.log.WithFields(logrus.Fields{"key": fileKey(e.spec), "token": e.spec.Name})
		fi, err := os.Stat(e.spec.File)
		if err != nil {
			if e.value != "" {
				log.WithError(err).Error("token file gone: token revoked")
				e.value, e.stat = "", fileStamp{}
			}
			continue
		}
		if stampOf(fi) == e.stat && (e.value == "" || !e.racy) {
			continue // unchanged, or still the invalid file we logged about
		}
		was := e.value
		if err := e.read(now); err != nil {
			e.value, e.stat = "", stampOf(fi)
			log.WithError(err).Error("token file invalid: token revoked")
			continue
		}
		if other := t.sameValueLocked(e); other != nil {
			e.value = ""
			log.WithField("other", fileKey(other.spec)).Error("token file holds the same token as another: token revoked")
			continue
		}
		switch {
		case e.value == was:
			// A recent file read again: the same token.
		case was != "":
			log.Info("token file changed: new token in use")
		default:
			log.Info("token file valid again: token in use")
		}
	}
}

// Lookup returns the identity of the bearer token got. It compares the
// SHA-256 digest of got with every token's in constant time, without
// stopping at a match, so the time taken says nothing of which token (or
// how much of one) matched.
func (t *Tokens) Lookup(got string) (Identity, bool) {
	sum := sha256.Sum256([]byte(got))
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshLocked()
	var found *tokenEntry
	for _, e := range t.entries {
		live := subtle.ConstantTimeByteEq(boolByte(e.value != ""), 1)
		if subtle.ConstantTimeCompare(sum[:], e.digest[:])&live == 1 {
			found = e
		}
	}
	if found == nil {
		return Identity{}, false
	}
	return Identity{Name: found.spec.Name, Scope: found.spec.Scope}, true
}

// byName returns the current value and identity of the live token name.
func (t *Tokens) byName(name string) (string, Identity, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshLocked()
	for _, e := range t.entries {
		if e.spec.Name == name && e.value != "" {
			return e.value, Identity{Name: name, Scope: e.spec.Scope}, true
		}
	}
	return "", Identity{}, false
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// forbiddenMessage is the message of a 403 for a request that needs more than
// id's scope.
func forbiddenMessage(need Scope, id Identity) string {
	return fmt.Sprintf("this request needs the %s scope; token %q has %s", need, id.Name, id.Scope)
}

func discardLog() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}
