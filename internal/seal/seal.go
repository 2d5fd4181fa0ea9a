// Package seal seals secret values for storage (state.db, etcd) with
// AES-256-GCM, and opens them again: the one place where csiactor
// encrypts at rest.
//
// # Basics
//
// A [Keyring] holds the current key, which seals, and any previous keys,
// which only open (for a rotation):
//
//	k, err := seal.Load("/etc/csiactor/secrets.key", "/etc/csiactor/secrets-old.key")
//	s := k.Seal("volume/v1", "password", "hunter2") // "v1:<key id>:<base64>"
//	v, err := k.Open("volume/v1", "password", s)
//
// Each value is sealed on its own, with a random 12-byte nonce, and with
// the record and the name it belongs to as additional data: a sealed value
// moved to another record or name does not open. A sealed value names the
// key that sealed it by its key ID ([KeyID]), so that a value sealed with a
// key the keyring lacks is reported by that ID.
//
// # Caveats
//
// Errors name records, names and key IDs, never a value. A key file must
// hold exactly [KeySize] bytes and be readable by its owner only
// ([ReadKeyFile]).
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// KeySize is the size of a key, in bytes (AES-256).
const KeySize = 32

// nonceSize is AES-GCM's standard nonce size.
const nonceSize = 12

// version prefixes every sealed value: "v1:<key id>:<base64 of nonce and
// ciphertext>".
const version = "v1"

var (
	// ErrUnknownKey is returned by Open for a value sealed with a key the
	// keyring does not have; the message names the value's key ID.
	ErrUnknownKey = errors.New("sealed with an unknown key")
	// ErrOpen is returned by Open for a value that is malformed or does not
	// authenticate: damaged, or moved from another record or name.
	ErrOpen = errors.New("cannot open sealed value")
	// ErrKeyFile is returned by ReadKeyFile and Load for a key file that
	// cannot be used.
	ErrKeyFile = errors.New("bad key file")
)

// Keyring seals with its current key and opens with it or any previous
// one. It is safe for concurrent use. A nil *Keyring seals nothing: use
// Enabled.
type Keyring struct {
	cur  *key
	byID map[string]*key
}

type key struct {
	id   string
	aead cipher.AEAD
	mac  []byte // the key for Digest: derived from the key, never the key itself
}

// KeyID returns the ID of key k: the first 8 bytes of its SHA-256, in hex
// (16 characters). It identifies a key without revealing it.
func KeyID(k []byte) string {
	sum := sha256.Sum256(k)
	return hex.EncodeToString(sum[:8])
}

// New returns a keyring that seals with current and opens with current and
// each of previous. Every key must be KeySize bytes.
func New(current []byte, previous ...[]byte) (*Keyring, error) {
	k := &Keyring{byID: map[string]*key{}}
	for i, raw := range append([][]byte{current}, previous...) {
		if len(raw) != KeySize {
			return nil, fmt.Errorf("%w: key %d is %d bytes, want %d", ErrKeyFile, i, len(raw), KeySize)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKeyFile, err)
		}
		mac := hmac.New(sha256.New, raw)
		mac.Write([]byte("csiactor-seal-digest-" + version))
		kk := &key{id: KeyID(raw), aead: aead, mac: mac.Sum(nil)}
		if i == 0 {
			k.cur = kk
		}
		if _, dup := k.byID[kk.id]; !dup {
			k.byID[kk.id] = kk
		}
	}
	return k, nil
}

// ReadKeyFile reads a key file: a regular file of exactly KeySize bytes
// that no one but its owner may read or write (mode 0600 or stricter).
// Errors wrap ErrKeyFile (or the fs error of a missing file) and name the
// path, never the content.
func ReadKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrKeyFile, path)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("%w: %s has mode %04o: others may read it; chmod 600 it", ErrKeyFile, path, fi.Mode().Perm())
	case fi.Size() != KeySize:
		return nil, fmt.Errorf("%w: %s holds %d bytes, want exactly %d random bytes (head -c %d /dev/urandom > FILE)",
			ErrKeyFile, path, fi.Size(), KeySize, KeySize)
	}
	b := make([]byte, KeySize)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrKeyFile, path, err)
	}
	return b, nil
}

// Load reads the current key file and the previous ones (ReadKeyFile)
// and returns their keyring.
func Load(current string, previous ...string) (*Keyring, error) {
	cur, err := ReadKeyFile(current)
	if err != nil {
		return nil, err
	}
	prev := make([][]byte, 0, len(previous))
	for _, p := range previous {
		b, err := ReadKeyFile(p)
		if err != nil {
			return nil, err
		}
		prev = append(prev, b)
	}
	return New(cur, prev...)
}

// Enabled reports whether k seals (is not nil).
func (k *Keyring) Enabled() bool { return k != nil }

// CurrentID returns the ID of the key that seals ("" for a nil keyring).
func (k *Keyring) CurrentID() string {
	if k == nil {
		return ""
	}
	return k.cur.id
}

// additionalData binds a value to its record and name.
func additionalData(record, name string) []byte {
	return []byte("csiactor-seal-" + version + "\x00" + record + "\x00" + name)
}

// Seal seals value, the secret name of record (like "volume/v1"), with the
// current key.
func (k *Keyring) Seal(record, name, value string) string {
	buf := make([]byte, nonceSize, nonceSize+len(value)+k.cur.aead.Overhead())
	if _, err := rand.Read(buf); err != nil {
		panic("seal: crypto/rand failed: " + err.Error()) // never, per crypto/rand
	}
	buf = k.cur.aead.Seal(buf, buf, []byte(value), additionalData(record, name))
	return version + ":" + k.cur.id + ":" + base64.RawStdEncoding.EncodeToString(buf)
}

// SealedKeyID returns the key ID a sealed value names, or an error
// wrapping ErrOpen for a value that is not one.
func SealedKeyID(sealed string) (string, error) {
	ver, rest, ok := strings.Cut(sealed, ":")
	id, _, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ver != version || len(id) != 16 {
		return "", fmt.Errorf("%w: not a sealed value of format %s", ErrOpen, version)
	}
	return id, nil
}

// Open opens sealed, the secret name of record. A value sealed with a key
// the keyring lacks fails with ErrUnknownKey naming its key ID; one that
// is damaged, or sealed for another record or name, with ErrOpen.
func (k *Keyring) Open(record, name, sealed string) (string, error) {
	id, err := SealedKeyID(sealed)
	if err != nil {
		return "", fmt.Errorf("secret %q of %s: %w", name, record, err)
	}
	if k == nil {
		return "", fmt.Errorf("secret %q of %s is sealed with key %s, and no secrets.key_file is set: %w", name, record, id, ErrUnknownKey)
	}
	kk, ok := k.byID[id]
	if !ok {
		return "", fmt.Errorf("secret %q of %s is sealed with key %s, which is neither secrets.key_file (key %s) nor one of secrets.previous_key_files: %w",
			name, record, id, k.cur.id, ErrUnknownKey)
	}
	raw, err := base64.RawStdEncoding.DecodeString(sealed[len(version)+1+len(id)+1:])
	if err != nil || len(raw) < nonceSize+kk.aead.Overhead() {
		return "", fmt.Errorf("secret %q of %s: %w: malformed", name, record, ErrOpen)
	}
	plain, err := kk.aead.Open(nil, raw[:nonceSize], raw[nonceSize:], additionalData(record, name))
	if err != nil {
		return "", fmt.Errorf("secret %q of %s: %w: it does not authenticate with key %s (damaged, or moved from another record)", name, record, ErrOpen, id)
	}
	return string(plain), nil
}

// Digest returns a keyed digest (HMAC-SHA256 with a key derived from the
// current key) of the secrets m of record: equal for equal maps, and
// revealing nothing of them without the key. Sealed values differ at
// every Seal; records compare their secrets by digest. It returns "" for
// an empty m.
func (k *Keyring) Digest(record string, m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	h := hmac.New(sha256.New, k.cur.mac)
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(record)
	for _, name := range names {
		field(name)
		field(m[name])
	}
	return k.cur.id + ":" + hex.EncodeToString(h.Sum(nil))
}

// SealMap seals every value of m (see Seal); nil for an empty m.
func (k *Keyring) SealMap(record string, m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for name, v := range m {
		out[name] = k.Seal(record, name, v)
	}
	return out
}

// OpenMap opens every value of m (see Open); nil for an empty m.
func (k *Keyring) OpenMap(record string, m map[string]string) (map[string]string, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(m))
	for name, v := range m {
		p, err := k.Open(record, name, v)
		if err != nil {
			return nil, err
		}
		out[name] = p
	}
	return out, nil
}

// Stale counts the values of m, a map of sealed values, that the current
// key did not seal (all of them for a nil keyring).
func (k *Keyring) Stale(m map[string]string) int {
	n := 0
	for _, v := range m {
		if id, err := SealedKeyID(v); err != nil || id != k.CurrentID() {
			n++
		}
	}
	return n
}
